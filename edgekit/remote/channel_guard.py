"""The agent's ``guard`` verb on a board, for as long as a channel of ours lives (agent/guard.py).

The board process holds its locks while it reads our channel, and runs its undo commands when the channel closes
— when we close it, after an error or Ctrl-C, or when edgekit is killed and sshd closes it. Over paramiko (a
channel of the runner's connection), over a fleet's OpenSSH master (a session of it: not tied to the thread that
opened it), or on this machine. The deploy lock, the power-mode guard and the bench guard are this one class.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shlex
import subprocess
import time
from collections.abc import Sequence
from typing import Any

import paramiko

from edgekit.errors import EdgekitError
from edgekit.remote import agent_ship
from edgekit.remote.mux import MuxRunner
from edgekit.remote.runner import LocalRunner, Runner, SshRunner

BUSY = 75  # the agent's exit when a lock stays busy (agent/guard.py)


class GuardRefused(EdgekitError):
    """The guard did not arm: ``busy`` names the lock someone else holds (None: it failed otherwise)."""

    def __init__(self, message: str, busy: str | None) -> None:
        super().__init__(message)
        self.busy = busy


def guard_args(locks: Sequence[str] = (), wait_s: float = 0, await_: str | None = None,
               undo: Sequence[Sequence[str]] = (), stop_under: str | None = None) -> list[str]:
    out: list[str] = ["--stop-under", stop_under] if stop_under else []
    for path in locks:
        out += ["--lock", path]
    out += ["--wait", str(wait_s)]
    if await_:
        out += ["--await", await_]
    for argv in undo:
        out += ["--undo", json.dumps(list(argv))]
    return out


class ChannelGuard:
    def __init__(self, runner: Runner, root: str, args: list[str], arm_timeout_s: float = 30) -> None:
        self.runner, self.root, self.args, self.arm_timeout_s = runner, root, args, arm_timeout_s
        self._chan: Any = None
        self._proc: subprocess.Popen[bytes] | None = None

    def _argv(self) -> list[str]:
        return agent_ship.argv(agent_ship.ensure(self.runner, self.root), "guard", *self.args)

    def __enter__(self) -> ChannelGuard:
        argv = self._argv()
        if isinstance(self.runner, MuxRunner):
            self._proc = self.runner.session(shlex.join(argv))
        elif isinstance(self.runner, LocalRunner):
            self._proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        elif isinstance(self.runner, SshRunner):
            self._chan = self.runner.conn.transport.open_session()
            self._chan.exec_command(shlex.join(argv))
        else:
            raise EdgekitError(f"Cannot hold a guard through a {type(self.runner).__name__}.")
        line = self._first_line(time.monotonic() + self.arm_timeout_s)
        try:
            said = json.loads(line)
        except ValueError:
            said = {}
        if said.get("armed") is True:
            return self
        code, err = self._end()
        if said.get("busy"):
            raise GuardRefused(f"{said['busy']} is held on board {self.runner.name!r}", str(said["busy"]))
        why = (err.strip().splitlines() or [f"exit {code}"])[-1]
        raise GuardRefused(f"The board-side guard did not start on board {self.runner.name!r}: {why[:300]}", None)

    def _first_line(self, deadline: float) -> bytes:
        buf = b""
        if self._proc is not None:
            assert self._proc.stdout is not None
            while not buf.endswith(b"\n") and (left := deadline - time.monotonic()) > 0:
                if not select.select([self._proc.stdout], [], [], left)[0]:
                    break
                byte = os.read(self._proc.stdout.fileno(), 1)
                if not byte:
                    break
                buf += byte
            return buf
        while b"\n" not in buf and time.monotonic() < deadline:
            if self._chan.recv_ready():
                buf += self._chan.recv(256)
            elif self._chan.exit_status_ready():
                break
            else:
                time.sleep(0.02)
        return buf

    def _end(self) -> tuple[int | None, str]:
        """The guard stopped without arming: its exit and stderr."""
        if self._proc is not None:
            self._proc.kill()
            _, err = self._proc.communicate()
            code: int | None = self._proc.returncode
            self._proc = None
            return code, err.decode(errors="replace")
        chan, self._chan = self._chan, None
        code = chan.recv_exit_status() if chan.exit_status_ready() else None
        err = chan.recv_stderr(4096).decode(errors="replace") if chan.recv_stderr_ready() else ""
        chan.close()
        return code, err

    def holder_fd(self) -> int | None:
        """A descriptor that keeps the guard armed while any process has it open (pass it to a child that works on
        the board, so the guard outlives a killed edgekit until that child ends): the write end of the session's
        stdin. None over a paramiko channel."""
        if self._proc is not None and self._proc.stdin is not None:
            return self._proc.stdin.fileno()
        return None

    def __exit__(self, *_exc: object) -> None:
        """EOF to the guard: it runs its undo commands (we wait for them, ≤ 60 s each side) and lets go."""
        if self._proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.communicate(timeout=150)
            if self._proc.poll() is None:
                self._proc.kill()
                self._proc.wait()
        if self._chan is not None:
            with contextlib.suppress(OSError, EOFError, paramiko.SSHException):  # a lost link ended it already
                self._chan.shutdown_write()
                self._chan.status_event.wait(150)
                self._chan.close()
