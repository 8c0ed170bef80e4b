"""Process helpers for the simulator: start detached, check "still ours", stop for good."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

import psutil

# Popen objects of the daemons this Python process started. Keeping them (a) stops Python from
# warning "subprocess still running" when they are garbage-collected and (b) lets `down`, when it
# runs in the same process (the pytest fixture), reap them so they don't linger as zombies.
_STARTED: dict[int, subprocess.Popen[bytes]] = {}


def spawn_detached(
    argv: Sequence[str], log: Path, env: dict[str, str] | None = None, cwd: Path | None = None
) -> tuple[int, float]:
    """Start ``argv`` in its own session with stdout+stderr appended to ``log``; return (pid, ctime)."""
    with open(log, "ab") as fh:
        proc = subprocess.Popen(
            list(argv), stdin=subprocess.DEVNULL, stdout=fh, stderr=subprocess.STDOUT,
            start_new_session=True, close_fds=True, env=env, cwd=cwd,
        )
    _STARTED[proc.pid] = proc
    return proc.pid, create_time(proc.pid) or 0.0


_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_EPOCH_LIKE = 1e9  # a ctime this large is seconds since 1970 (older states, systems without /proc)


def create_time(pid: int) -> float | None:
    """When ``pid`` started, as an identity that never changes: seconds since boot on Linux.

    Not psutil's epoch time: that is the boot time plus the start, and the boot time moves with every
    clock step. On a CI VM whose clock stepped, every board's sshd looked like another process: the
    boards were "restarted" on new ports, the old sshds left running, and a test asking for a fresh
    board got a restarted old one, releases and all.
    """
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return int(fields[19]) / _CLOCK_TICKS
    except FileNotFoundError:
        if Path("/proc/self/stat").exists():
            return None  # Linux, and the process is gone
    except (OSError, ValueError, IndexError):
        pass
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None


def alive(pid: int | None, ctime: float | None = None) -> bool:
    """True when ``pid`` runs (not a zombie) and, given ``ctime``, is still the process we started."""
    if not pid:
        return False
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        if ctime is None:
            return True
        if ctime > _EPOCH_LIKE:  # recorded as epoch time: compare loosely, the clock may have stepped
            return abs(proc.create_time() - ctime) < 1.0
        now = create_time(pid)
        return now is not None and abs(now - ctime) < 0.5 / _CLOCK_TICKS
    except psutil.Error:
        return False


def tree(pid: int, ctime: float | None = None) -> list[psutil.Process]:
    """The process and all its descendants (empty when it is gone or a different process now)."""
    if not alive(pid, ctime):
        return []
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


def _gone(proc: psutil.Process) -> bool:
    started = _STARTED.get(proc.pid)
    if started is not None and started.poll() is not None:
        _STARTED.pop(proc.pid, None)
        return True
    try:
        # A zombie runs nothing and holds no port; where PID 1 does not reap, it stays one.
        return proc.status() == psutil.STATUS_ZOMBIE
    except psutil.Error:
        return True


def _wait(procs: list[psutil.Process], timeout: float) -> list[psutil.Process]:
    deadline = time.monotonic() + timeout
    while True:
        procs = [p for p in procs if not _gone(p)]
        if not procs or time.monotonic() >= deadline:
            return procs
        time.sleep(0.02)


def stop(procs: Iterable[psutil.Process], timeout: float = 3.0) -> list[int]:
    """SIGTERM each process, SIGKILL what is left after ``timeout``; returns the pids still alive."""
    procs = list({p.pid: p for p in procs if p.pid != os.getpid()}.values())
    for proc in procs:
        _signal(proc, signal.SIGTERM)
    left = _wait(procs, timeout)
    for proc in left:
        _signal(proc, signal.SIGKILL)
    return [p.pid for p in _wait(left, 2.0)]


def _signal(proc: psutil.Process, sig: int) -> None:
    with contextlib.suppress(psutil.Error):
        proc.send_signal(sig)  # psutil checks the pid was not reused since we looked it up


def _ephemeral_low() -> int:
    """The first port the kernel hands to outgoing connections (Linux default 32768)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


# Each kind of port lives in its own residue mod 4, so one kind never lands on another's port even
# across sim dirs that do not know of each other: a service port's candidate (service + 1) is free
# while no release is being switched, and an sshd or test server picked then would take it for good.
PORT_RESIDUE = {"service": 0, "ssh": 2, "other": 3}  # 1: the candidate of service port 4k


def free_port(avoid: Iterable[int] = (), kind: str = "other") -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (the caller retries if it loses a race).

    Drawn from below the kernel's ephemeral range: a sim board's service port stays free while its
    server is stopped (bench, rollback), and a port from that range could meanwhile become the local
    end of any outgoing connection on this machine ("Address already in use" at the restart).
    A ``service`` port comes with its candidate port (+1), which must be free too.
    """
    avoid = set(avoid)
    residue = PORT_RESIDUE[kind]
    high = _ephemeral_low()
    low = max(1024, min(20000, high - 4096))
    for _ in range(200):
        port = random.randrange(low, high - 1)
        port += (residue - port) % 4
        wanted = (port, port + 1) if kind == "service" else (port,)
        if port >= high - 1 or avoid.intersection(wanted) or not all(_bindable(p) for p in wanted):
            continue
        return port
    raise RuntimeError(f"no free TCP port found on 127.0.0.1 in {low}-{high - 1}")


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def wait_ssh_banner(port: int, pid: int, pidfile: Path, timeout: float = 10.0) -> bool:
    """Wait until sshd ``pid`` listens on 127.0.0.1:port and answers with an SSH banner.

    sshd writes its PidFile only once it has bound its address, so our pid in it proves the
    banner comes from our sshd and not from whatever else may hold the port.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not alive(pid):
            return False
        try:
            ours = int(pidfile.read_text().split()[0]) == pid
        except (OSError, ValueError, IndexError):
            ours = False
        if ours:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1.0) as s:
                    if s.recv(64).startswith(b"SSH-2.0-"):
                        return True
            except OSError:
                pass
        time.sleep(0.01)
    return False
