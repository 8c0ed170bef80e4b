"""What a site pull's sources can do to a board's disk (`agent site-pull`, the real aria2c, no nginx): sources of our
own on 127.0.0.1 that misbehave.

* A source that sends far more than the blob is stopped at the blob's size and leaves nothing in staging; the next
  source gives the blob.
* A source that redirects (HTTP 302) is refused, whether its HEAD says so or only its GET does.
* A source that dies halfway leaves nothing for the next one to append to: the next sends the blob whole.
* Staging is emptied before and after the pull, links removed and never followed.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

AGENT = Path(__file__).resolve().parents[1] / "edgekit" / "agent" / "edgekit_agent.py"
pytestmark = pytest.mark.skipif(shutil.which("aria2c") is None, reason="aria2c comes with .ci/install")

Answer = Callable[[BaseHTTPRequestHandler], None]


@contextlib.contextmanager
def source(answer: Answer) -> Iterator[tuple[str, list[tuple[str, str | None]]]]:
    """An HTTP source on 127.0.0.1 that answers every HEAD and GET with ``answer``: its URL and the requests it had
    (method, Range header)."""
    seen: list[tuple[str, str | None]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append((self.command, self.headers.get("Range")))
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # aria2c hung up (or was stopped)
                answer(self)

        do_HEAD = do_GET

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def send(status: int, body: bytes, length: int | None = None, **headers: str) -> Answer:
    """Answer ``status`` with ``body`` (on a GET), saying Content-Length ``length`` (default: the body's; -1: none),
    then close the connection (HTTP/1.0): a body shorter than its length is a source that died."""
    def answer(h: BaseHTTPRequestHandler) -> None:
        h.send_response(status)
        if length != -1:
            h.send_header("Content-Length", str(len(body) if length is None else length))
        for name, value in headers.items():
            h.send_header(name, value)
        h.end_headers()
        if h.command == "GET":
            h.wfile.write(body)
    return answer


def good(blob: bytes) -> Answer:
    return send(200, blob)


def pull(tmp: Path, blob: bytes, sources: list[str]) -> dict:
    tmp.mkdir(exist_ok=True)
    spec = {"store": str(tmp / "store"), "staging": str(tmp / "staging"), "sources": sources,
            "blobs": [{"sha256": hashlib.sha256(blob).hexdigest(), "size": len(blob), "executable": False}]}
    (tmp / "spec.json").write_text(json.dumps(spec))
    res = subprocess.run([sys.executable, str(AGENT), "site-pull", str(tmp / "spec.json")], capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert set(out) == {"blobs", "seconds"}
    return out["blobs"][0]


def landed(tmp: Path, blob: bytes) -> bytes:
    return (tmp / "store" / hashlib.sha256(blob).hexdigest()).read_bytes()


def assert_staging_empty(tmp: Path) -> None:
    assert not list((tmp / "staging").iterdir())  # no part file, no .aria2 control file


@pytest.mark.parametrize("length", [None, -1], ids=["content-length", "no-content-length"])
def test_a_source_that_sends_10x_the_blob_is_stopped_and_the_next_used(tmp_path: Path, length: int | None) -> None:
    blob = os.urandom(200_000)
    with source(send(200, b"\0" * (10 * len(blob)), length)) as (junk, _), source(good(blob)) as (ok, _):
        out = pull(tmp_path, blob, [junk, ok])
    assert out["source"] == ok and out["bytes"] == len(blob)
    assert [t["ok"] for t in out["tries"]] == [False, True]
    assert out["tries"][0]["exit"] == -signal.SIGXFSZ  # stopped by the size bound, not at the end
    assert landed(tmp_path, blob) == blob
    assert_staging_empty(tmp_path)


def test_a_small_blob_from_a_flooding_source_costs_a_bounded_few_bytes(tmp_path: Path) -> None:
    # 5 MB of junk, with no Content-Length, for a 1,000-byte blob, and no other source.
    blob = os.urandom(1000)
    with source(send(200, b"\0" * (5 << 20), -1)) as (junk, _):
        out = pull(tmp_path, blob, [junk])
    assert out["source"] is None and out["tries"][0]["exit"] == -signal.SIGXFSZ
    assert not (tmp_path / "store" / hashlib.sha256(blob).hexdigest()).exists()
    assert_staging_empty(tmp_path)


def test_a_source_that_redirects_is_refused(tmp_path: Path) -> None:
    blob = os.urandom(50_000)
    sha = hashlib.sha256(blob).hexdigest()
    with source(good(blob)) as (ok, seen_ok), source(send(302, b"", Location=f"{ok}/{sha}")) as (mover, _):
        alone = pull(tmp_path / "alone", blob, [mover])
        assert seen_ok == []  # refused before anything asked the target
        then = pull(tmp_path / "then", blob, [mover, ok])
    assert alone["source"] is None and alone["tries"][0]["exit"] is None
    assert "302" in alone["tries"][0]["error"]
    assert then["source"] == ok and [t["ok"] for t in then["tries"]] == [False, True]
    assert landed(tmp_path / "then", blob) == blob
    assert_staging_empty(tmp_path / "alone")
    assert_staging_empty(tmp_path / "then")


def test_a_source_that_redirects_only_the_get_is_refused_too(tmp_path: Path) -> None:
    blob = os.urandom(50_000)
    sha = hashlib.sha256(blob).hexdigest()
    with source(good(blob)) as (ok, _):
        redirect = send(302, b"", Location=f"{ok}/{sha}")

        def sly(h: BaseHTTPRequestHandler) -> None:  # a HEAD looks fine, the GET goes elsewhere
            (good(blob) if h.command == "HEAD" else redirect)(h)

        with source(sly) as (mover, seen):
            out = pull(tmp_path, blob, [mover])
    assert [m for m, _ in seen] == ["HEAD", "GET"]
    assert out["source"] is None and out["tries"][0]["exit"] is None
    assert "redirected" in out["tries"][0]["error"]
    assert not (tmp_path / "store" / sha).exists()  # the right bytes, by the wrong way: not taken
    assert_staging_empty(tmp_path)


@pytest.mark.parametrize("first_half", ["junk", "the blob's"])
def test_a_source_that_dies_halfway_leaves_nothing_to_append_to(tmp_path: Path, first_half: str) -> None:
    blob = os.urandom(300_000)
    half = (b"\xff" * len(blob) if first_half == "junk" else blob)[: len(blob) // 2]
    with source(send(200, half, len(blob))) as (dies, seen_dies), source(good(blob)) as (ok, seen_ok):
        out = pull(tmp_path, blob, [dies, ok])
    assert any(m == "GET" for m, _ in seen_dies)
    assert out["source"] == ok and out["tries"][0]["ok"] is False
    # the second source sent it whole, from byte 0: nothing of the first's was resumed from
    assert [r for m, r in seen_ok if m == "GET"] in ([None], ["bytes=0-"])
    assert out["bytes"] == len(blob)
    assert landed(tmp_path, blob) == blob
    assert_staging_empty(tmp_path)


def test_staging_is_emptied_before_the_pull_and_links_are_not_followed(tmp_path: Path) -> None:
    blob = os.urandom(10_000)
    sha = hashlib.sha256(blob).hexdigest()
    outside = tmp_path / "outside"
    (outside / "dir").mkdir(parents=True)
    (outside / "dir" / "keep").write_bytes(b"keep")
    (outside / "file").write_bytes(b"keep")
    staging = tmp_path / "board" / "staging"
    (staging / "old" / "deeper").mkdir(parents=True)
    (staging / "old" / "deeper" / "junk").write_bytes(b"\0" * 100_000)
    (staging / sha).write_bytes(b"\xff" * 5000)  # a partial from another source: must not be resumed
    (staging / f"{sha}.aria2").write_bytes(b"\0" * 60)
    (staging / "link-to-dir").symlink_to(outside / "dir")
    (staging / "link-to-file").symlink_to(outside / "file")
    (staging / "old" / "inner-link").symlink_to(outside)
    during: list[set[str]] = []

    def look_then_send(h: BaseHTTPRequestHandler) -> None:  # what staging holds while the pull runs
        during.append(set(os.listdir(staging)))
        good(blob)(h)

    with source(look_then_send) as (ok, _):
        out = pull(tmp_path / "board", blob, [ok])
    assert during and all(names <= {sha, f"{sha}.aria2"} for names in during)  # emptied before
    assert out["source"] == ok and out["bytes"] == len(blob) and landed(tmp_path / "board", blob) == blob
    assert_staging_empty(tmp_path / "board")  # and after
    assert (outside / "dir" / "keep").read_bytes() == b"keep" and (outside / "file").read_bytes() == b"keep"


def test_a_staging_that_is_a_link_is_replaced_not_followed(tmp_path: Path) -> None:
    blob = os.urandom(10_000)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_bytes(b"keep")
    (tmp_path / "board").mkdir()
    (tmp_path / "board" / "staging").symlink_to(outside)
    with source(good(blob)) as (ok, _):
        out = pull(tmp_path / "board", blob, [ok])
    assert out["source"] == ok and landed(tmp_path / "board", blob) == blob
    staging = tmp_path / "board" / "staging"
    assert staging.is_dir() and not staging.is_symlink()
    assert_staging_empty(tmp_path / "board")
    assert [p.name for p in outside.iterdir()] == ["keep"]


def test_staging_is_emptied_after_a_pull_that_found_nothing(tmp_path: Path) -> None:
    blob = os.urandom(10_000)
    with source(send(404, b"")) as (nothing, _):
        out = pull(tmp_path, blob, [nothing])
    assert out["source"] is None and out["tries"][0]["exit"] not in (0, None)
    assert_staging_empty(tmp_path)
