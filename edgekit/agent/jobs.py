"""Background jobs on the board that outlive the SSH command that started them, and no one else.

    job-start DIR ARGV...           ARGV started in a session of its own; answers its wrapper's pid
    job-wait  DIR POLLS [--collect FILE]   up to POLLS × 0.1 s: done (its exit code, FILE's text), running, gone
    job-stop  DIR GRACE             SIGTERM to the command, GRACE seconds for its exit code, then SIGKILL to all

A job is a wrapper process (this agent, forked, ``setsid``: the SSH session's end does not reach it) that runs the
command with its stdout and stderr in DIR/out and DIR/err, and writes DIR/pid (its own pid, which is also the
job's process group), DIR/child (the command's pid) and, once the command ended, DIR/window (the board's
monotonic clock just before the command started and just after it ended: the exact window a power sample file is
cut to) and DIR/rc (its exit status; 128+N for a signal N, as a shell says). Each file appears whole (written to a
temporary name, renamed). The host polls in short calls, never one long blocking command: a Ctrl-C there reaches
it promptly, and its cleanup stops the job by its pid. Standard library only (Python 3.8).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from typing import Any

_FILES = ("pid", "child", "window", "rc", "out", "err")
POLL_S = 0.1


class JobError(ValueError):
    """A job that cannot be started: one sentence."""


def _write(path: str, text: str) -> None:
    tmp = path + ".part"
    with open(tmp, "w") as fh:
        fh.write(text + "\n")
    os.replace(tmp, path)


def _read_int(path: str) -> int | None:
    try:
        with open(path) as fh:
            text = fh.read().strip()
    except OSError:
        return None
    return int(text) if text.lstrip("-").isdigit() else None


def alive(pid: int | None) -> bool:
    """A process that exists and is not a zombie."""
    if not pid:
        return False
    try:
        with open(f"/proc/{pid}/stat") as fh:
            stat = fh.read()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2:][:1] != "Z"


def _wrapper(job_dir: str, argv: list[str]) -> None:
    """The forked wrapper: a session of its own, the command, its exit status. Never returns."""
    code = 0
    try:
        os.setsid()
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):  # the SSH channel's pipes: let the starting command's session end
            os.dup2(devnull, fd)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        _write(os.path.join(job_dir, "pid"), str(os.getpid()))
        with open(os.path.join(job_dir, "out"), "wb") as out, open(os.path.join(job_dir, "err"), "wb") as err:
            t0 = time.monotonic()
            try:
                proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                        restore_signals=True)
            except OSError as exc:
                err.write(f"cannot run {argv[0]}: {exc.strerror}\n".encode())
                _write(os.path.join(job_dir, "child"), "0")
                _write(os.path.join(job_dir, "rc"), "127")
                return
            _write(os.path.join(job_dir, "child"), str(proc.pid))
            rc = proc.wait()
            _write(os.path.join(job_dir, "window"), f"{t0!r} {time.monotonic()!r}")
        _write(os.path.join(job_dir, "rc"), str(128 - rc if rc < 0 else rc))
    except BaseException:  # a forked child must never return into the caller's code
        code = 1
    finally:
        os._exit(code)


def start(job_dir: str, argv: list[str], wait_s: float = 10.0) -> dict[str, Any]:
    if not argv:
        raise JobError("job-start takes a command to run")
    os.makedirs(job_dir, exist_ok=True)
    for name in _FILES:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(job_dir, name))
    pid = os.fork()
    if pid == 0:
        _wrapper(job_dir, argv)
    # The wrapper is this process's child until it exits: reap it here if it ends while we wait.
    deadline = time.monotonic() + wait_s
    child = None
    while time.monotonic() < deadline:
        child = _read_int(os.path.join(job_dir, "child"))
        if child is not None:
            break
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        time.sleep(0.02)
    return {"pid": pid, "child": child}


def wait(job_dir: str, polls: int, collect: str = "") -> dict[str, Any]:
    pid = _read_int(os.path.join(job_dir, "pid"))
    rc_file = os.path.join(job_dir, "rc")
    for _ in range(max(polls, 0)):
        if os.path.isfile(rc_file) or not alive(pid):
            break
        time.sleep(POLL_S)
    rc = _read_int(rc_file)
    if rc is not None:
        text = None
        if collect:
            with contextlib.suppress(OSError), open(collect, encoding="utf-8", errors="replace") as fh:
                text = fh.read()
        return {"state": "done", "rc": rc, "window": _window(job_dir), "collected": text}
    child = _read_int(os.path.join(job_dir, "child"))
    if alive(pid) or alive(child):
        return {"state": "running"}
    return {"state": "gone", "pid": pid, "child": child}


def _window(job_dir: str) -> list[float] | None:
    try:
        with open(os.path.join(job_dir, "window")) as fh:
            t0, t1 = (float(x) for x in fh.read().split())
    except (OSError, ValueError):
        return None
    return [t0, t1]


def _kill(pid: int | None, sig: int, group: bool = False) -> None:
    if pid:
        with contextlib.suppress(OSError):
            os.killpg(pid, sig) if group else os.kill(pid, sig)


def stop(job_dir: str, grace_s: float) -> dict[str, Any]:
    rc_file = os.path.join(job_dir, "rc")
    if os.path.isfile(rc_file):
        return {"stopped": "ended"}
    pid, child = _read_int(os.path.join(job_dir, "pid")), _read_int(os.path.join(job_dir, "child"))
    if alive(child):
        _kill(child, signal.SIGTERM)  # the command finishes its file (the sampler writes its end line)
    deadline = time.monotonic() + grace_s
    while not os.path.isfile(rc_file) and alive(pid) and time.monotonic() < deadline:
        time.sleep(POLL_S)
    if alive(pid) or alive(child):
        _kill(pid, signal.SIGKILL, group=True)  # the wrapper leads the job's process group
        _kill(pid, signal.SIGKILL)
        _kill(child, signal.SIGKILL)
        return {"stopped": "killed"}
    return {"stopped": "stopped"}
