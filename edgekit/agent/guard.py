"""``guard``: a board process that lives as long as edgekit's channel, and undoes what it was told when it goes.

    guard [--lock FILE]... [--wait S] [--await FILE] [--stop-under DIR] [--undo ARGV_JSON]...

It takes each ``--lock`` (flock, waiting up to ``--wait`` seconds), waits for ``--await`` to be free (a lock another
program holds, e.g. an activation still finishing: up to ``--wait`` + 20 s), prints ``{"armed": true}``, then reads
stdin until it ends — edgekit closed the channel, or died and sshd closed it — and runs each ``--undo`` command in
order (an argv as a JSON list); with ``--stop-under``, first the processes whose arguments name DIR (a killed
bench's jobs: its load, its sampler) are stopped. The locks go with the process. One pattern for the deploy
lock, the power-mode guard (the board's mode and clocks put back) and the bench guard (the deployed service
started again after a killed bench). Exit 75 when a lock stays busy. Standard library only (Python 3.8).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from typing import IO

BUSY = 75  # EX_TEMPFAIL: someone else holds the board; try again later
UNDO_TIMEOUT_S = 120.0


class GuardError(ValueError):
    """One sentence (the agent's exit 2, as for any ValueError)."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--lock", action="append", default=[], metavar="FILE",
                   help="flock this file while the channel lives")
    p.add_argument("--wait", type=float, default=0.0, help="seconds to wait for a busy lock (default 0)")
    p.add_argument("--await", dest="await_", default=None, metavar="FILE",
                   help="then wait (--wait + 20 s) until this lock is free, without keeping it")
    p.add_argument("--stop-under", default=None, metavar="DIR",
                   help="when the channel closes, first stop every process whose arguments name DIR")
    p.add_argument("--undo", action="append", default=[], metavar="ARGV_JSON",
                   help="a command (JSON list) run when the channel closes; repeatable, run in order")


def _undo_list(items: list[str]) -> list[list[str]]:
    out = []
    for item in items:
        try:
            argv = json.loads(item)
        except ValueError:
            raise GuardError(f"--undo {item[:60]!r} is not JSON") from None
        if not (isinstance(argv, list) and argv and all(isinstance(a, str) for a in argv)):
            raise GuardError(f"--undo {item[:60]!r} is not a list of strings")
        out.append(argv)
    return out


def _flock(path: str, deadline: float) -> int | None:
    """An exclusive flock on ``path`` (made if missing), or None once ``deadline`` passed."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.monotonic() >= deadline:
                os.close(fd)
                return None
            time.sleep(0.1)


def _ancestors() -> set[int]:
    """This process and its parents (the session's shell may still name DIR in its command line)."""
    pids, pid = set(), os.getpid()
    while pid > 1 and pid not in pids:
        pids.add(pid)
        try:
            with open(f"/proc/{pid}/status") as fh:
                pid = next(int(line.split()[1]) for line in fh if line.startswith("PPid:"))
        except (OSError, StopIteration, ValueError):
            break
    return pids


def _naming(path: str) -> list[int]:
    needle, spare = path.rstrip("/").encode(), _ancestors()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) in spare:
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as fh:
                args = fh.read().split(b"\0")
        except OSError:
            continue
        if any(needle in a for a in args):
            found.append(int(name))
    return found


def stop_under(path: str, grace_s: float = 3.0) -> int:
    """SIGTERM to every process whose arguments name ``path``, SIGKILL to those still there after ``grace_s``."""
    pids = _naming(path)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, sig)
        deadline = time.monotonic() + grace_s
        while pids and time.monotonic() < deadline:
            time.sleep(0.1)
            pids = [p for p in _naming(path) if p in pids]
    return len(pids)


def _say(obj: dict, out: IO[str]) -> None:
    out.write(json.dumps(obj) + "\n")
    out.flush()


def run(args: argparse.Namespace, inp: IO[bytes] | None = None, out: IO[str] | None = None) -> int:
    inp = inp or sys.stdin.buffer
    out = out or sys.stdout
    undo = _undo_list(args.undo)
    held = []
    start = time.monotonic()
    for path in args.lock:
        fd = _flock(path, start + args.wait)
        if fd is None:
            _say({"armed": False, "busy": path}, out)
            return BUSY
        held.append(fd)
    if args.await_:
        fd = _flock(args.await_, start + args.wait + 20)
        if fd is None:
            _say({"armed": False, "busy": args.await_}, out)
            return BUSY
        os.close(fd)  # free now: it was only waited for
    _say({"armed": True}, out)
    while inp.read(1 << 16):  # until the channel closes
        pass
    if args.stop_under:
        stop_under(args.stop_under)
    done = []
    for argv in undo:
        try:
            code = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE, timeout=UNDO_TIMEOUT_S, check=False).returncode
        except (OSError, subprocess.TimeoutExpired):
            code = -1
        done.append({"argv": argv, "exit": code})
    with contextlib.suppress(OSError):  # the channel is gone with its reader: the undo is what mattered
        _say({"undone": done}, out)
    for fd in held:
        os.close(fd)
    return 0
