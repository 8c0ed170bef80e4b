"""Run commands on a board: over SSH (Fabric) or on this machine for a `local` board.

Commands are argument lists; the SSH runner quotes each argument with shlex, so no board name,
path or recipe value is ever parsed by the remote shell as code.
"""

from __future__ import annotations

import contextlib
import shlex
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import paramiko

from edgekit.config.boardfile import Board
from edgekit.errors import EdgekitError, LinkLost
from edgekit.remote.connection import open_connection


@dataclass(frozen=True)
class Result:
    argv: tuple[str, ...]
    exit_code: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


class RemoteCommandError(EdgekitError):
    def __init__(self, board: str, result: Result) -> None:
        tail = (result.stderr.strip() or result.stdout.strip()).splitlines()[-1:] or ["no output"]
        super().__init__(
            f"`{shlex.join(result.argv)[:120]}` failed on board {board!r} "
            f"(exit {result.exit_code}): {tail[0][:300]}"
        )
        self.result = result


class Runner(Protocol):
    name: str
    agents: set[str]  # the agent zipapps known to be on this board (remote.agent_ship)

    def run(self, argv: Sequence[str], *, check: bool = True, timeout: float | None = None,
            env: Mapping[str, str] | None = None, stdin: bytes | None = None) -> Result: ...

    def close(self) -> None: ...


def _with_env(argv: Sequence[str], env: Mapping[str, str] | None) -> list[str]:
    return (["env", *(f"{k}={v}" for k, v in env.items())] if env else []) + list(argv)


class SshRunner:
    def __init__(self, board: Board, name: str) -> None:
        self.name = name
        self.board = board
        self.agents: set[str] = set()
        self.conn = open_connection(board, name)

    def run(self, argv: Sequence[str], *, check: bool = True, timeout: float | None = None,
            env: Mapping[str, str] | None = None, stdin: bytes | None = None) -> Result:
        full = _with_env(argv, env)
        if stdin is not None:
            return self._run_fed(full, stdin, check, timeout)
        try:
            res = self.conn.run(shlex.join(full), hide=True, warn=True, timeout=timeout, in_stream=False)
        except Exception as exc:  # invoke's CommandTimedOut and transport errors
            if type(exc).__name__ == "CommandTimedOut":
                raise EdgekitError(f"`{shlex.join(full)[:120]}` timed out on board {self.name!r}.") from None
            raise LinkLost(f"Lost the SSH connection to board {self.name!r}: {exc}.") from None
        if not self.conn.is_connected:  # the link was given up while the command ran (connection._Liveness)
            raise LinkLost(f"Lost the SSH connection to board {self.name!r} while `{shlex.join(full)[:80]}` ran.")
        result = Result(tuple(full), res.exited, res.stdout, res.stderr)
        if check and not result.ok:
            raise RemoteCommandError(self.name, result)
        return result

    def _run_fed(self, full: list[str], stdin: bytes, check: bool, timeout: float | None) -> Result:
        """``full`` with ``stdin`` as its input, on a channel of our own (invoke's stdin thread writes after the
        remote side may have closed it), reading stdout and stderr as they come so neither fills its window."""
        deadline = None if timeout is None else time.monotonic() + timeout
        out, err = bytearray(), bytearray()
        try:
            self.conn.open()
            chan = self.conn.client.get_transport().open_session()
            try:
                chan.exec_command(shlex.join(full))
                chan.sendall(stdin)
                chan.shutdown_write()
                while True:
                    busy = False
                    while chan.recv_ready():
                        out += chan.recv(1 << 16)
                        busy = True
                    while chan.recv_stderr_ready():
                        err += chan.recv_stderr(1 << 16)
                        busy = True
                    if not busy and chan.exit_status_ready() and not chan.recv_ready() \
                            and not chan.recv_stderr_ready():
                        break
                    if deadline is not None and time.monotonic() > deadline:
                        raise EdgekitError(f"`{shlex.join(full)[:120]}` timed out on board {self.name!r}.")
                    if not busy:
                        time.sleep(0.002)
                code = chan.recv_exit_status()
            finally:
                chan.close()
        except (OSError, EOFError, paramiko.SSHException, AttributeError) as exc:
            raise LinkLost(f"Lost the SSH connection to board {self.name!r}: {exc or type(exc).__name__}.") from None
        result = Result(tuple(full), code, out.decode(errors="replace"), err.decode(errors="replace"))
        if check and not result.ok:
            raise RemoteCommandError(self.name, result)
        return result

    def sftp(self) -> paramiko.SFTPClient:
        return self.conn.sftp()

    def reconnect(self) -> None:
        """A new connection in place of a lost one (what ran on the old one has ended with it)."""
        with contextlib.suppress(Exception):  # the old transport may be half dead: closing it must not raise
            self.conn.close()
        self.conn = open_connection(self.board, self.name)

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> SshRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class LocalRunner:
    """For a board that is this machine (nightly CI on a self-hosted Jetson runner)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.agents: set[str] = set()

    def run(self, argv: Sequence[str], *, check: bool = True, timeout: float | None = None,
            env: Mapping[str, str] | None = None, stdin: bytes | None = None) -> Result:
        full = _with_env(argv, env)
        try:
            raw = subprocess.run(full, capture_output=True, timeout=timeout, check=False, input=stdin)
            proc = subprocess.CompletedProcess(raw.args, raw.returncode, raw.stdout.decode(errors="replace"),
                                               raw.stderr.decode(errors="replace"))
        except subprocess.TimeoutExpired:
            raise EdgekitError(f"`{shlex.join(full)[:120]}` timed out on this machine.") from None
        except FileNotFoundError:
            raise EdgekitError(f"`{full[0]}` is not installed on this machine.") from None
        result = Result(tuple(full), proc.returncode, proc.stdout, proc.stderr)
        if check and not result.ok:
            raise RemoteCommandError(self.name, result)
        return result

    def close(self) -> None:
        pass

    def __enter__(self) -> LocalRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def runner_for(board: Board, name: str) -> SshRunner | LocalRunner:
    return LocalRunner(name) if board.local else SshRunner(board, name)
