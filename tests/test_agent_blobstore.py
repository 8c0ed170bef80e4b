"""The agent's store verbs (agent/blobstore.py), run as a board runs them: ``python3 <zipapp> <verb> ...``, the
zipapp built by edgekit.remote.agent_ship (the system python3 plays the board's)."""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import tarfile
import zipfile
from pathlib import Path

import pytest

from edgekit.remote import agent_ship

PYTHON3 = "/usr/bin/python3"


@pytest.fixture
def pyz(agent_pyz: Path) -> Path:
    return agent_pyz


def verb(pyz: Path, *args: str, stdin: bytes = b"", ok: bool = True) -> subprocess.CompletedProcess:
    res = subprocess.run([PYTHON3, str(pyz), *args], input=stdin, capture_output=True, check=False, timeout=60)
    if ok:
        assert res.returncode == 0, res.stderr.decode()[-2000:]
    return res


def answer(res: subprocess.CompletedProcess) -> dict:
    return json.loads(res.stdout.decode().strip().splitlines()[-1])


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_the_zipapp_is_the_same_bytes_for_the_same_sources_and_named_by_them() -> None:
    agent_ship.app.cache_clear()
    first = agent_ship.app()
    agent_ship.app.cache_clear()
    again = agent_ship.app()
    assert first == again and first.name == f"edgekit-agent-{sha(first.data)[:16]}.pyz"
    names = zipfile.ZipFile(io.BytesIO(first.data)).namelist()
    assert names[0] == "__main__.py" and "_edgekit_agent/blobstore.py" in names and "_edgekit_agent/cli.py" in names


def test_inventory_lists_blobs_parts_and_free_space(pyz: Path, tmp_path: Path) -> None:
    store = tmp_path / "base" / "store"
    a, b, c = (sha(x) for x in (b"a", b"b", b"c"))
    absent = answer(verb(pyz, "inventory", str(store), a))
    assert absent["exists"] is False and absent["have"] == {} and not store.exists()  # read-only without --create
    verb(pyz, "inventory", "--create", str(store))
    (store / a).write_bytes(b"a")
    (store / a).chmod(0o755)
    (store / b).write_bytes(b"b")
    (store / f"{c}.part").write_bytes(b"cc")
    got = answer(verb(pyz, "inventory", str(store), a, b, c))
    assert got["have"] == {a: True, b: False} and got["parts"] == {c: 2} and got["free_bytes"] > 0
    refused = verb(pyz, "inventory", str(store), "../../etc/passwd", ok=False)
    assert refused.returncode == 2 and b"not a sha256" in refused.stderr


def test_receive_resumes_a_part_and_places_the_blob_only_when_it_matches(pyz: Path, tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    data = os.urandom(3 << 20)
    s = sha(data)
    (store / f"{s}.part").write_bytes(data[:1000])
    got = answer(verb(pyz, "receive", str(store), s, str(len(data)), "1000", "--executable", stdin=data[1000:]))
    assert got == {"result": "ok", "cut": False}
    assert (store / s).read_bytes() == data and (store / s).stat().st_mode & 0o777 == 0o755
    assert not (store / f"{s}.part").exists()
    # A stream cut short: exit 3, what arrived kept in the part for the next push.
    t = sha(data[::-1])
    cut = verb(pyz, "receive", str(store), t, str(len(data)), "0", stdin=data[::-1][:5000], ok=False)
    assert cut.returncode == 3 and answer(cut)["cut"] and (store / f"{t}.part").stat().st_size == 5000
    # Bytes that are not the blob: the digest they had, nothing placed.
    wrong = answer(verb(pyz, "receive", str(store), t, "4", "0", stdin=b"abcd"))
    assert wrong["result"] == sha(b"abcd") and not (store / t).exists()


def test_hash_and_check_find_a_blob_corrupted_at_rest(pyz: Path, tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    good, rotten = b"good", b"rotten"
    (store / sha(good)).write_bytes(good)
    (store / sha(rotten)).write_bytes(b"rotted")  # same size, other bytes: mtime and size say nothing
    (store / f"{sha(b'p')}.part").write_bytes(b"p")
    assert answer(verb(pyz, "hash", "--parts", str(store), sha(b"p")))["digests"] == {sha(b"p"): sha(b"p")}
    got = answer(verb(pyz, "check", str(store), sha(good), sha(rotten), sha(b"absent")))
    assert got["bad"] == [sha(rotten)] and got["checked"] == 2 and got["bytes"] == len(good)
    assert got["missing"] == [sha(b"absent")]
    assert (store / sha(good)).exists() and not (store / sha(rotten)).exists()


def test_follow_hashes_files_as_they_are_written(pyz: Path, tmp_path: Path) -> None:
    one, two = tmp_path / "one", tmp_path / "two"
    one.write_bytes(b"x" * 100)
    two.write_bytes(b"y" * 60)  # longer than the 50 it was announced as
    res = verb(pyz, "follow", str(one), "100", str(two), "50")
    lines = [json.loads(ln) for ln in res.stdout.decode().splitlines()]
    assert lines == [{"index": 0, "digest": sha(b"x" * 100)}, {"index": 1, "digest": "long"}]


def _tar(parts: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in parts.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o600
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def test_place_renames_good_uploads_and_runs_the_release_step_only_when_all_are_good(pyz: Path,
                                                                                     tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    good, bad = b"good bytes", b"bad bytes"
    good_sha, bad_sha = sha(good), sha(b"what was meant")
    then = ["--", "touch", str(tmp_path / "made")]
    (store / f"{good_sha}.part").write_bytes(good)
    (store / f"{bad_sha}.part").write_bytes(bad)
    got = answer(verb(pyz, "place", str(store), good_sha, "0755", bad_sha, "0644", *then))
    assert got == {"placed": [good_sha], "bad": {bad_sha: sha(bad)}}
    assert (store / good_sha).read_bytes() == good and (store / good_sha).stat().st_mode & 0o777 == 0o755
    assert not (store / f"{bad_sha}.part").exists() and not (store / bad_sha).exists()
    assert not (tmp_path / "made").exists()  # a bad upload: no release from this store
    # The uploads as a tar stream on stdin, placed in the same command; then the release step runs.
    got = answer(verb(pyz, "place", "--tar", str(store), bad_sha, "0644", *then,
                      stdin=_tar({f"{bad_sha}.part": b"what was meant"})))
    assert got == {"placed": [bad_sha], "bad": {}} and (tmp_path / "made").exists()
    # A stream that carries anything but this push's parts is refused before anything is written.
    sneaky = verb(pyz, "place", "--tar", str(store), good_sha, "0644", stdin=_tar({"../escape.part": b"x"}), ok=False)
    assert sneaky.returncode == 2 and b"not a part of this push" in sneaky.stderr
    assert not (tmp_path / "escape.part").exists()


def test_place_with_nothing_uploaded_still_runs_the_release_step(pyz: Path, tmp_path: Path) -> None:
    # Every blob came from the site's boards: no part to place, and the release is made in the same command.
    store = tmp_path / "store"
    store.mkdir()
    got = answer(verb(pyz, "place", str(store), "--", "touch", str(tmp_path / "made")))
    assert got == {"placed": [], "bad": {}} and (tmp_path / "made").exists()
