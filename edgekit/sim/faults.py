"""Faults a simulated board suffers, and what it must still be after one: the invariants the torture benchmark
(benchmarks/torture.py) and the tests check. A power cut is `boards.power_cut` (then `boards.up` boots it)."""

from __future__ import annotations

import hashlib
import json
import os
import time
import urllib.request
from pathlib import Path

import psutil

from edgekit.sim import boards as sim
from edgekit.sim import state as sim_state
from edgekit.sim.testing import SimBoard

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


def answers(port: int, timeout: float = 2.0) -> bool:
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


def violations(board: SimBoard, verify_blobs: bool = True) -> list[str]:
    """What is wrong with the board now, one sentence each; [] when it serves a complete release that passed its
    check, with `current`, `serving` and the unit agreeing and no blob holding other bytes than its name says."""
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
    if not answers(board.service_port):
        wrong.append("/health does not answer 200")
    if verify_blobs:
        for blob in sorted((board.base / "store").iterdir()) if (board.base / "store").is_dir() else []:
            if blob.is_file() and not blob.name.endswith(".part") and sha256(blob) != blob.name:
                wrong.append(f"blob {blob.name} holds other bytes")
    return wrong


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


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
