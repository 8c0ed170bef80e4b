"""Faults a simulated board suffers, and what it must still be after one: the invariants the torture benchmark
(benchmarks/torture.py) and the tests check. A power cut is `boards.power_cut` (then `boards.up` boots it)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import psutil

from edgekit.sim import boards as sim
from edgekit.sim import state as sim_state
from edgekit.sim.testing import SimBoard
from edgekit.store import sha256_file

SERVICE = "edgekit-serve.service"


def server_processes(board: SimBoard) -> list[psutil.Process]:
    """The processes of the board's service (under its systemctl stand-in's supervisor), the server among them."""
    st = sim_state.load(board.dir.parent)
    pid = sim.services(st.boards[board.name]).get(SERVICE) if st and board.name in st.boards else None
    try:
        return psutil.Process(pid).children(recursive=True) if pid else []
    except psutil.Error:
        return []


def hang(board: SimBoard) -> int:
    """The service's processes stopped (SIGSTOP): alive, answering nothing. Returns how many."""
    stopped = 0
    for proc in server_processes(board):
        try:
            proc.suspend()
            stopped += 1
        except psutil.Error:
            continue
    return stopped


FILLER = ".filler"  # the file that fills a board's disk (``fill_disk``)


def can_mount() -> bool:
    """Whether this process may mount a tmpfs (root, with the capability): what ``small_disk`` needs."""
    if os.geteuid() != 0:
        return False
    probe = Path(os.environ.get("TMPDIR", "/tmp")) / f"edgekit-mount-probe-{os.getpid()}"
    probe.mkdir(exist_ok=True)
    try:
        if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(probe)],
                          capture_output=True).returncode != 0:
            return False
        subprocess.run(["umount", str(probe)], capture_output=True)
        return True
    finally:
        probe.rmdir()


@contextlib.contextmanager
def small_disk(board: SimBoard, mb: int) -> Iterator[Path]:
    """The board's base on a filesystem of its own of ``mb`` MB (a tmpfs: root only), so that it can fill; what the
    base held is moved onto it. Unmounted at the end (lazily: the board's processes may still hold files)."""
    base = board.base
    aside = base.with_name(base.name + ".aside")
    if base.exists():
        base.rename(aside)
    base.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={mb}m,mode=0755", "tmpfs", str(base)], check=True,
                   capture_output=True)
    try:
        if aside.exists():
            shutil.copytree(aside, base, symlinks=True, dirs_exist_ok=True)
            shutil.rmtree(aside)
        yield base
    finally:
        subprocess.run(["umount", "-l", str(base)], capture_output=True)


def fill_disk(board: SimBoard) -> int:
    """Take every free byte of the board's base filesystem (a file ``.filler``); returns how many were taken."""
    st = os.statvfs(board.base)
    free = st.f_bavail * st.f_frsize
    with open(board.base / FILLER, "ab", buffering=0) as fh, contextlib.suppress(OSError):
        os.posix_fallocate(fh.fileno(), 0, free)
        fh.seek(0, os.SEEK_END)
        while fh.write(bytes(1 << 16)):  # what fallocate's rounding left, until ENOSPC
            pass
    return free


def free_disk(board: SimBoard) -> None:
    """What ``fill_disk`` took, given back (the board's owner cleaned up)."""
    with contextlib.suppress(FileNotFoundError):
        (board.base / FILLER).unlink()


def answers(port: int, timeout: float = 2.0, netns: str | None = None) -> bool:
    """Whether the board's server answers /health 200 on its loopback (``netns``: a board in a network namespace of
    its own, edgekit.sim.netns.site, asked from inside it)."""
    if netns is not None:
        probe = [sys.executable, "-c", "import sys, urllib.request as u; "
                 "sys.exit(u.urlopen(sys.argv[1], timeout=float(sys.argv[2])).status != 200)",
                 f"http://127.0.0.1:{port}/health", str(timeout)]
        return subprocess.run(["ip", "netns", "exec", netns, *probe], capture_output=True,
                              timeout=timeout + 30).returncode == 0
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=timeout) as resp:
            return resp.status == 200
    except OSError:
        return False


def unit_release(board: SimBoard) -> str | None:
    """The release the installed service unit runs (its WorkingDirectory)."""
    unit = board.root / "etc" / "systemd" / "system" / SERVICE
    prefix = f"WorkingDirectory={board.base}/releases/"
    lines = unit.read_text().splitlines() if unit.is_file() else []
    return next((line[len(prefix):] for line in lines if line.startswith(prefix)), None)


def current(board: SimBoard) -> str | None:
    try:
        return os.readlink(board.base / "current").removeprefix("releases/")
    except OSError:
        return None


def violations(board: SimBoard, verify_blobs: bool = True, netns: str | None = None) -> list[str]:
    """What is wrong with the board now, one sentence each; [] when it serves a complete release that passed its
    check, with `current`, `serving` and the unit agreeing and no blob holding other bytes than its name says
    (``netns``: where its server runs, for a board in a namespace of its own)."""
    rid = current(board)
    if rid is None:
        return ["`current` names no release"]
    rdir = board.base / "releases" / rid
    wrong = []
    try:
        manifest = json.loads((rdir / "release.json").read_text())
    except (OSError, ValueError):
        return [f"`current` names {rid}, which has no readable release.json"]
    missing = [rel for rel in manifest.get("files") or {} if not (rdir / rel).is_file()]
    if missing:
        wrong.append(f"release {rid} lacks {len(missing)} of its files ({missing[0]}, …)")
    if not (rdir / "health.json").is_file():
        wrong.append(f"release {rid} is current but never passed its check")
    serving = (board.base / "serving").read_text().strip() if (board.base / "serving").is_file() else None
    if serving != rid:
        wrong.append(f"`serving` says {serving}, `current` {rid}")
    if unit_release(board) != rid:
        wrong.append(f"the service unit runs {unit_release(board)}, `current` is {rid}")
    if not answers(board.service_port, netns=netns):
        wrong.append("/health does not answer 200")
    if verify_blobs:
        for blob in sorted((board.base / "store").iterdir()) if (board.base / "store").is_dir() else []:
            if blob.is_file() and not blob.name.endswith(".part") and sha256_file(blob) != blob.name:
                wrong.append(f"blob {blob.name} holds other bytes")
    return wrong


def settle(board: SimBoard, limit: float = 120.0) -> tuple[float | None, list[str]]:
    """Seconds until the board has no violation (None if it still had some after ``limit``), and the last ones."""
    t0 = time.monotonic()
    while True:
        wrong = violations(board, verify_blobs=False)
        if not wrong:
            wrong = violations(board)  # the blobs once, when the rest holds
            if not wrong:
                return time.monotonic() - t0, []
        if time.monotonic() - t0 > limit:
            return None, wrong
        time.sleep(0.5)
