"""Pushing blobs into a board's content-addressed store, against a simulated board (real sshd, loopback)."""

from __future__ import annotations

import hashlib
import io
import json
import os
import pwd
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from rich.console import Console

from edgekit.config.boardfile import Board
from edgekit.errors import EdgekitError
from edgekit.remote import agent_ship, fastsftp, transfer
from edgekit.remote.connection import connection
from edgekit.remote.probe import probe
from edgekit.remote.runner import SshRunner
from edgekit.remote.transfer import (
    Blob,
    PushReport,
    TransferProgress,
    check_sha256,
    push_blobs,
    push_many,
    resolve_base,
    store_path,
)
from edgekit.sim.testing import SimBoard

if TYPE_CHECKING:
    from conftest import SimSession

MiB = 1 << 20


# ------------------------------------------------------------------------------------ the board


@pytest.fixture(scope="module")
def sim_board(sim_session: SimSession) -> SimBoard:
    """A simulated board (real sshd on 127.0.0.1, host key pinned); each test pushes to its own base."""
    (board,) = sim_session.boards(1)
    return board


def make_board(sim_board: SimBoard, base: Path | str) -> Board:
    return Board(host=sim_board.host, port=sim_board.port, user=sim_board.user, key=str(sim_board.key),
                 profile=sim_board.profile, base=str(base), known_hosts=str(sim_board.known_hosts))


@pytest.fixture
def base(tmp_path: Path) -> Path:
    # No quotes: the board file refuses them in a base (systemd cannot run from such a path).
    return tmp_path / "board base $(touch PWNED) `touch PWNED` ;x & 100%"


@pytest.fixture
def runner(sim_board: SimBoard, base: Path) -> Iterator[SshRunner]:
    with SshRunner(make_board(sim_board, base), "b1") as r:
        yield r


# ---------------------------------------------------------------------------------------- blobs


def blob_of(path: Path, data: bytes, executable: bool = False) -> Blob:
    path.write_bytes(data)
    return Blob(hashlib.sha256(data).hexdigest(), len(data), path, executable)


@pytest.fixture
def blobs(tmp_path: Path) -> list[Blob]:
    src = tmp_path / "src"
    src.mkdir()
    return [
        blob_of(src / "model.gguf", os.urandom(3 * MiB + 12345)),
        blob_of(src / "llama server $(id)", b"#!/bin/sh\necho hi\n", executable=True),
        blob_of(src / "empty", b""),
    ]


def assert_in_store(base: Path, blobs: list[Blob]) -> None:
    store = base / "store"
    for b in blobs:
        final = store / b.sha256
        assert final.read_bytes() == b.path.read_bytes()
        assert final.stat().st_mode & 0o777 == (0o755 if b.executable else 0o644)
    assert not list(store.glob("*.part"))


# ---------------------------------------------------------------------------------------- tests


@pytest.mark.parametrize("verify", ["openssh", "stream", "after"])
def test_fresh_push_then_noop(runner: SshRunner, base: Path, blobs: list[Blob], verify: str) -> None:
    out = io.StringIO()
    with TransferProgress(Console(file=out, width=120)) as progress:
        report = push_blobs(runner, str(base), [*blobs, blobs[0]], progress, verify=verify)
    total = sum(b.size for b in blobs)
    assert (report.sent_bytes, report.sent_blobs, report.skipped_blobs, report.resumed_bytes) == (total, 3, 0, 0)
    assert progress.counts("b1") == (total, total)
    if verify != "openssh":  # the OpenSSH client carries the bytes there, with its own AES-GCM session
        assert runner.conn.client.get_transport().local_cipher in fastsftp.GCM_CIPHERS  # switched by a rekey
    assert_in_store(base, blobs)
    assert not (base.parent / "PWNED").exists() and not Path("PWNED").exists()
    assert store_path(str(base), blobs[0].sha256) == str(base / "store" / blobs[0].sha256)

    again = push_blobs(runner, str(base), blobs, verify=verify)
    assert (again.sent_bytes, again.sent_blobs, again.skipped_blobs) == (0, 0, 3)
    assert set(again.to_dict()) == {"sent_bytes", "sent_blobs", "skipped_blobs", "resumed_bytes", "seconds", "retries",
                                    "rechecked_bytes", "corrupt_blobs"}


@pytest.mark.parametrize("verify", ["openssh", "stream"])
@pytest.mark.parametrize("fraction", [0.5, 1.0])
def test_resume_from_part(runner: SshRunner, base: Path, blobs: list[Blob], fraction: float, verify: str) -> None:
    big = blobs[0]
    have = int(big.size * fraction)  # 1.0: cut after the upload, before the rename
    (base / "store").mkdir(parents=True)
    (base / "store" / f"{big.sha256}.part").write_bytes(big.path.read_bytes()[:have])
    report = push_blobs(runner, str(base), [big], verify=verify)
    assert (report.resumed_bytes, report.sent_bytes, report.sent_blobs) == (have, big.size - have, 1)
    assert_in_store(base, [big])


_KILLED_PUSH = """
import json, sys, time
from edgekit.config.boardfile import Board
from edgekit.remote.runner import SshRunner
from edgekit.remote.transfer import Blob, TransferProgress, push_blobs
from pathlib import Path

class Slow(TransferProgress):  # slow enough that the kill lands mid-upload
    def advance(self, board, n):
        super().advance(board, n)
        time.sleep(0.02)

args = json.loads(sys.argv[1])
runner = SshRunner(Board(**args["board"]), "b1")
push_blobs(runner, args["board"]["base"], [Blob(args["sha"], args["size"], Path(args["path"]))],
           Slow(disable=True), verify="stream")  # SFTP: paced by the progress; the OpenSSH cut is below
"""


def test_resume_after_sigkill(sim_board: SimBoard, runner: SshRunner, base: Path, tmp_path: Path) -> None:
    big = blob_of(tmp_path / "big.bin", os.urandom(48 * MiB))
    part = base / "store" / f"{big.sha256}.part"
    args = {"board": make_board(sim_board, base).model_dump(), "sha": big.sha256, "size": big.size,
            "path": str(big.path)}
    proc = subprocess.Popen([sys.executable, "-c", _KILLED_PUSH, json.dumps(args)])
    try:
        deadline = time.monotonic() + 30
        while not (part.exists() and part.stat().st_size >= 8 * MiB):
            assert proc.poll() is None and time.monotonic() < deadline, "the push ended before the cut"
            time.sleep(0.01)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    # The server side writes what it had received, then sees the connection gone: wait for that.
    cut, stable_since = -1, time.monotonic()
    while time.monotonic() - stable_since < 0.3:
        if part.stat().st_size != cut:
            cut, stable_since = part.stat().st_size, time.monotonic()
        time.sleep(0.02)
    assert 8 * MiB <= cut < big.size
    report = push_blobs(runner, str(base), [big])
    assert report.resumed_bytes == cut and report.sent_bytes == big.size - cut
    assert_in_store(base, [big])


@pytest.mark.parametrize("verify", ["openssh", "stream", "after"])
def test_corrupted_part_is_sent_again(runner: SshRunner, base: Path, blobs: list[Blob], verify: str) -> None:
    big = blobs[0]
    (base / "store").mkdir(parents=True)
    (base / "store" / f"{big.sha256}.part").write_bytes(os.urandom(big.size // 2))  # wrong bytes
    with TransferProgress(disable=True) as progress:
        report = push_blobs(runner, str(base), [big], progress, verify=verify)
    sent = big.size - big.size // 2 + big.size
    assert progress.counts("b1") == (sent, sent)
    # The bad prefix was found by the board-side hash, deleted, and the whole blob sent again.
    assert report.sent_blobs == 1 and report.resumed_bytes == 0
    assert report.sent_bytes == sent
    assert_in_store(base, [big])


def test_a_verifier_that_dies_falls_back_to_hashing_after(
    runner: SshRunner, base: Path, blobs: list[Blob], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A streaming verifier that ends early (killed, refused) still leaves verified pushes: hashed after.
    monkeypatch.setattr(transfer, "FOLLOW", "no-such-verb")  # the agent refuses it: the verifier ends at once
    report = push_blobs(runner, str(base), blobs, verify="stream")
    assert report.sent_blobs == 3
    assert_in_store(base, blobs)


def test_part_longer_than_blob_starts_over(runner: SshRunner, base: Path, blobs: list[Blob]) -> None:
    big = blobs[0]
    (base / "store").mkdir(parents=True)
    (base / "store" / f"{big.sha256}.part").write_bytes(os.urandom(big.size + 10))
    report = push_blobs(runner, str(base), [big])
    assert (report.sent_bytes, report.resumed_bytes) == (big.size, 0)
    assert_in_store(base, [big])


@pytest.mark.parametrize("verify", ["openssh", "stream", "after"])
def test_content_not_matching_its_hash_is_refused(runner: SshRunner, base: Path, tmp_path: Path, verify: str) -> None:
    liar = Blob(hashlib.sha256(b"what the manifest says").hexdigest(), 5 * MiB, tmp_path / "changed")
    liar.path.write_bytes(os.urandom(5 * MiB))
    with pytest.raises(EdgekitError, match=r"arrived on board .b1. with sha256 .*, not sha256 .*rebuild the artifact"):
        push_blobs(runner, str(base), [liar], verify=verify)
    assert list((base / "store").iterdir()) == []  # neither the final name nor a .part


def test_local_file_must_match_its_size(runner: SshRunner, base: Path, tmp_path: Path) -> None:
    b = blob_of(tmp_path / "f", b"12345")
    with pytest.raises(EdgekitError, match="is 5 bytes but its manifest says 6"):
        push_blobs(runner, str(base), [Blob(b.sha256, 6, b.path)])
    with pytest.raises(EdgekitError, match="is missing"):
        push_blobs(runner, str(base), [Blob(b.sha256, 5, tmp_path / "nope")])


@pytest.fixture
def tiny_fs(tmp_path: Path) -> Iterator[Path]:
    if os.geteuid() != 0 or not shutil.which("mount"):
        pytest.skip("mounting a 1 MiB tmpfs needs root")
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], capture_output=True, text=True,
                         check=False)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {res.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


def test_tiny_filesystem_gets_the_free_space_error(sim_board: SimBoard, tiny_fs: Path, blobs: list[Blob]) -> None:
    with SshRunner(make_board(sim_board, tiny_fs), "tiny") as r, pytest.raises(EdgekitError) as err:
        push_blobs(r, str(tiny_fs), blobs)
    assert re.fullmatch(r"Board 'tiny' has 1\.0 MB free in .* but the push needs 20\.\d MB "
                        r"\(3\.2 MB of blobs \+ margin\); nothing was sent\.", str(err.value))
    assert list((tiny_fs / "store").iterdir()) == []


def test_a_write_failure_mid_upload_is_raised(runner: SshRunner, tiny_fs: Path, tmp_path: Path) -> None:
    # paramiko ignores the replies of pipelined writes still in flight at close(); we must not.
    big = blob_of(tmp_path / "big", os.urandom(3 * MiB))
    with pytest.raises(OSError):
        fastsftp.upload(runner.sftp(), big.path, str(tiny_fs / "x.part"), big.size)


def test_gcm_transport_factory_for_the_connection_code(sim_board: SimBoard, tmp_path: Path) -> None:
    conn = connection(make_board(sim_board, tmp_path), "b1")
    conn.connect_kwargs["transport_factory"] = fastsftp.gcm_transport
    with conn:
        conn.open()
        transport = conn.client.get_transport()
        assert transport.local_cipher == "aes128-gcm@openssh.com"
        assert fastsftp.prefer_gcm(transport) == "aes128-gcm@openssh.com"  # no rekey needed


def test_remote_names_are_hashes_only(tmp_path: Path) -> None:
    good = hashlib.sha256(b"x").hexdigest()
    assert check_sha256(good) == good
    for bad in ["../../etc/passwd", good.upper(), good[:-1], good + "0", f"{good[:-1]}\n", "", f"$({good})", None]:
        with pytest.raises(EdgekitError, match="is not a sha256"):
            Blob(bad, 1, tmp_path / "f")  # type: ignore[arg-type]
        with pytest.raises(EdgekitError):
            store_path("/base", bad)  # type: ignore[arg-type]
    with pytest.raises(EdgekitError, match="invalid size"):
        Blob(good, -1, tmp_path / "f")


def test_resolve_base_expands_home_once(runner: SshRunner) -> None:
    home = pwd.getpwuid(os.geteuid()).pw_dir.rstrip("/")
    assert resolve_base(runner, "~/edge kit $(x)") == f"{home}/edge kit $(x)"
    assert resolve_base(runner, "~") == home
    assert resolve_base(runner, "/srv/edgekit/") == "/srv/edgekit"


def test_push_many_reports_each_board(sim_board: SimBoard, tmp_path: Path, blobs: list[Blob]) -> None:
    (tmp_path / "not a dir").write_text("a file where the base should be")
    bases = {f"b{i}": tmp_path / f"fleet {i}" for i in range(3)} | {"broken": tmp_path / "not a dir"}
    runners = [SshRunner(make_board(sim_board, b), name) for name, b in bases.items()]
    try:
        with TransferProgress(disable=True) as progress:
            results = push_many([(r, str(bases[r.name])) for r in runners], blobs, progress)
    finally:
        for r in runners:
            r.close()
    assert set(results) == set(bases)
    assert set(results.succeeded) == {"b0", "b1", "b2"} and set(results.failed) == {"broken"}
    assert all(isinstance(r, PushReport) and r.sent_blobs == 3 for r in results.succeeded.values())
    # The base is a file: the first thing made under it (the agent's directory) says so, in one sentence.
    why = str(results["broken"])
    assert why.startswith("Sending edgekit's agent to board 'broken'") and why.endswith("Not a directory.")
    for i in range(3):
        assert_in_store(bases[f"b{i}"], blobs)



def test_openssh_push_keeps_the_host_key_policy(runner: SshRunner, base: Path, blobs: list[Blob],
                                                tmp_path: Path) -> None:
    # The OpenSSH data path trusts exactly what edgekit's own connections trust: a known_hosts without
    # the board's key refuses it, and nothing lands on the board.
    import shutil as sh

    board = runner.board.model_copy(update={"known_hosts": str(tmp_path / "empty_known_hosts")})
    (tmp_path / "empty_known_hosts").write_text("")
    argv = transfer.sshstream.ssh_argv(board)
    assert "StrictHostKeyChecking=yes" in argv and "-F" in argv and sh.which("ssh")
    item = transfer.sshstream.Item(blobs[0].sha256, blobs[0].size, 0, False, blobs[0].path)
    (base / "store").mkdir(parents=True)
    agent = agent_ship.ensure(runner, str(base))
    with pytest.raises(EdgekitError, match=r"Host key verification failed"):
        transfer.sshstream.upload(board, "b1", agent, str(base / "store"), item)
    assert list((base / "store").iterdir()) == []


def test_a_cut_openssh_stream_leaves_a_part_the_next_push_resumes(runner: SshRunner, base: Path,
                                                                  tmp_path: Path) -> None:
    big = blob_of(tmp_path / "big.bin", os.urandom(32 * MiB))
    cut = tmp_path / "first-12-MiB.bin"  # the stream ends there, as when the connection drops
    cut.write_bytes(big.path.read_bytes()[: 12 * MiB])
    (base / "store").mkdir(parents=True)
    item = transfer.sshstream.Item(big.sha256, big.size, 0, False, cut)
    with pytest.raises(EdgekitError, match="run the push again to resume"):
        transfer.sshstream.upload(runner.board, "b1", agent_ship.ensure(runner, str(base)), str(base / "store"), item)
    assert (base / "store" / f"{big.sha256}.part").stat().st_size == 12 * MiB
    assert not (base / "store" / big.sha256).exists()
    report = push_blobs(runner, str(base), [big], verify="openssh")
    assert (report.resumed_bytes, report.sent_bytes, report.sent_blobs) == (12 * MiB, big.size - 12 * MiB, 1)
    assert_in_store(base, [big])


_KILLED_OPENSSH_PUSH = """
import json, sys
from edgekit.config.boardfile import Board
from edgekit.remote.runner import SshRunner
from edgekit.remote.transfer import Blob, push_blobs
from pathlib import Path

args = json.loads(sys.argv[1])
push_blobs(SshRunner(Board(**args["board"]), "b1"), args["board"]["base"],
           [Blob(args["sha"], args["size"], Path(args["path"]))], verify="openssh")
"""


def test_a_killed_openssh_push_leaves_no_sender_behind(sim_board: SimBoard, runner: SshRunner, base: Path,
                                                       tmp_path: Path) -> None:
    # ssh reads the blob file itself: killed with edgekit it must stop, not finish the blob behind the
    # next push's back (it once renamed the part away while the next push was resuming it).
    import psutil

    big = blob_of(tmp_path / "big.bin", os.urandom(192 * MiB))
    part, final = base / "store" / f"{big.sha256}.part", base / "store" / big.sha256
    args = {"board": make_board(sim_board, base).model_dump(), "sha": big.sha256, "size": big.size,
            "path": str(big.path)}
    proc = subprocess.Popen([sys.executable, "-c", _KILLED_OPENSSH_PUSH, json.dumps(args)])
    senders: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 30
        while not (part.exists() and part.stat().st_size >= 4 * MiB):
            assert proc.poll() is None and time.monotonic() < deadline, "the push ended before the cut"
            time.sleep(0.002)
        senders = [p for p in psutil.Process(proc.pid).children() if p.name() == "ssh"]
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert senders, "the push did not go through an ssh child"
    _, alive = psutil.wait_procs(senders, timeout=5)
    assert not alive, f"ssh {[p.pid for p in alive]} kept sending after edgekit was killed"
    cut, stable_since = -1, time.monotonic()
    while time.monotonic() - stable_since < 0.5 and part.exists():  # the board writes what it had, then stops
        if part.stat().st_size != cut:
            cut, stable_since = part.stat().st_size, time.monotonic()
        time.sleep(0.02)
    assert not final.exists(), "the killed push's ssh went on and placed the blob"
    assert 4 * MiB <= cut < big.size
    report = push_blobs(runner, str(base), [big], verify="openssh")
    assert report.resumed_bytes == cut and report.sent_blobs == 1
    assert_in_store(base, [big])


def test_a_blob_rotted_at_rest_is_sent_anew_before_a_release_is_activated_from_it(
        runner: SshRunner, base: Path, blobs: list[Blob]) -> None:
    push_blobs(runner, str(base), blobs)
    big = blobs[0]
    stored = base / "store" / big.sha256
    # A pushed release made of hard links to the store (as releases/<id> is): the same inode rots with it.
    (base / "releases" / "r2").mkdir(parents=True)
    os.link(stored, base / "releases" / "r2" / "model.gguf")
    with open(stored, "r+b") as fh:  # one byte flipped in place: size and mtime say nothing
        fh.seek(1000)
        byte = fh.read(1)
        fh.seek(1000)
        fh.write(bytes([byte[0] ^ 0xFF]))
    # A redeploy of what the board serves trusts its store (it is serving those bytes): nothing hashed, sent.
    trusted = push_blobs(runner, str(base), blobs)
    assert (trusted.sent_bytes, trusted.rechecked_bytes, trusted.corrupt_blobs) == (0, 0, 0)
    report = push_blobs(runner, str(base), blobs, recheck_for="r2")
    assert report.corrupt_blobs == 1 and report.sent_blobs == 1 and report.sent_bytes == big.size
    assert report.rechecked_bytes == sum(b.size for b in blobs[1:])  # the good ones, hashed again
    assert_in_store(base, blobs)
    assert not (base / "releases" / "r2").exists()  # made from the bad copy: to be made again from the store


def test_the_agent_reaches_a_board_once_per_version(sim_board: SimBoard, runner: SshRunner, base: Path,
                                                     blobs: list[Blob]) -> None:
    push_blobs(runner, str(base), blobs)  # the first command of this edgekit on the board sends its agent
    pyz = base / "agent" / agent_ship.app().name
    sent = pyz.stat().st_mtime_ns
    assert [p.name for p in (base / "agent").iterdir()] == [pyz.name]  # no temporary name left
    with SshRunner(make_board(sim_board, base), "b1") as again:
        assert agent_ship.app().name in probe(again, str(base)).agents  # the probe is the look for it
        calls: list[list[str]] = []
        run = again.run

        def counted(argv, **kw):  # type: ignore[no-untyped-def]
            calls.append(list(argv))
            return run(argv, **kw)

        again.run = counted  # type: ignore[method-assignment]
        push_blobs(again, str(base), blobs)
    assert calls and not [c for c in calls if c[0] in ("test", "dd", "mkdir")], calls
    assert all(c[1] == str(pyz) for c in calls if c[0] == "python3")  # every board step: a verb of that agent
    assert pyz.stat().st_mtime_ns == sent
