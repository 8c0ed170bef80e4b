"""A board runner over one OpenSSH ControlMaster, the connection a fleet run's playbook then reuses.

A fleet run used to open two SSH connections per board: edgekit's own (paramiko: probe, lock, release
state, /health) and then Ansible's OpenSSH master. On the 2-core benchmark machine every connection is
a key exchange and an sshd process tree on the cores the boards share. Here edgekit starts the master
itself, at the control path Ansible computes (``<dir>/%C``: a hash of this host, the board's host, port
and user), and runs its commands as sessions of it; Ansible's ssh finds the socket and multiplexes too.

The master is made by the first command (the probe: one process, one round trip) with the same policy
as every edgekit connection (``openssh_options``: only the pinned host key, only the board's key). When
it cannot be made, paramiko connects once more to say why in the sentence `edgekit deploy` would (a
host that does not answer is named from ssh's own message). What needs paramiko itself (SFTP for
on-board builds, the sysroot stream) opens its connection on first use.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO

from fabric import Connection

from edgekit.config.boardfile import Board
from edgekit.errors import EdgekitError, LinkLost
from edgekit.remote.connection import CONNECT_TIMEOUT_S, open_connection, ssh_argv
from edgekit.remote.runner import RemoteCommandError, Result, SshRunner, _with_env

CONTROL_NAME = "%C"  # as ansible.cfg's control_path: ssh expands it to the same hash for the same board
PERSIST = "60s"  # as ansible.cfg; the lock's session keeps the master busy for the whole run


def _decoded(proc: subprocess.CompletedProcess[bytes]) -> subprocess.CompletedProcess[str]:
    return subprocess.CompletedProcess(proc.args, proc.returncode, proc.stdout.decode(errors="replace"),
                                       proc.stderr.decode(errors="replace"))


class MuxRunner(SshRunner):
    """``SshRunner``'s interface over an OpenSSH master in ``control_dir``; ``conn`` (paramiko) opened lazily."""

    def __init__(self, board: Board, name: str, control_dir: Path) -> None:
        # Not SshRunner.__init__: that opens the paramiko connection this runner exists to avoid.
        self.name, self.board = name, board
        self.agents: set[str] = set()
        self._conn: Connection | None = None
        self._connected = False
        full = ssh_argv(board)
        self._ssh = [*full[:-1], "-o", f"ControlPath={control_dir}/{CONTROL_NAME}",
                     "-o", f"ControlPersist={PERSIST}"]
        self._host = full[-1]

    def argv(self, *tail: str) -> list[str]:
        """ssh argv for a session of the master (``tail``: one shell command string, or ``-W host:port``
        before the host); the first one run (the fleet's probe) makes the master, in the same process."""
        if tail[:1] == ("-W",):
            return [*self._ssh, "-o", "ControlMaster=auto", *tail, self._host]
        return [*self._ssh, "-o", "ControlMaster=auto", self._host, *tail]

    def run(self, argv: Sequence[str], *, check: bool = True, timeout: float | None = None,
            env: Mapping[str, str] | None = None, stdin: bytes | None = None) -> Result:
        full = _with_env(argv, env)
        try:
            raw = subprocess.run(self.argv(shlex.join(full)), capture_output=True, timeout=timeout, input=stdin,
                                 stdin=subprocess.DEVNULL if stdin is None else None)
            proc = _decoded(raw)
        except subprocess.TimeoutExpired:
            raise EdgekitError(f"`{shlex.join(full)[:120]}` timed out on board {self.name!r}.") from None
        if proc.returncode == 255 and not self.alive():  # ssh's own failure, not the command's exit 255
            why = (proc.stderr.strip().splitlines() or ["the master connection ended"])[-1]
            if not self._connected:
                raise self._cannot_connect(why)
            raise LinkLost(f"Lost the SSH connection to board {self.name!r}: {why}.")
        self._connected = True
        result = Result(tuple(full), proc.returncode, proc.stdout, proc.stderr)
        if check and not result.ok:
            raise RemoteCommandError(self.name, result)
        return result

    def _cannot_connect(self, why: str) -> EdgekitError:
        where = f"{self.board.user}@{self.board.host}:{self.board.port}"
        if why.startswith("ssh: connect to host") or why.startswith("ssh: Could not resolve"):
            reason = why.rsplit(": ", 1)[-1]
            if "timed out" in reason:
                return EdgekitError(f"Board {self.name!r} ({where}) did not answer within {CONNECT_TIMEOUT_S} s.")
            return EdgekitError(f"Cannot reach board {self.name!r} ({where}): {reason}.")
        # A host that answered (changed or unknown host key, refused key): paramiko connects once more for the
        # sentence `edgekit deploy` gives, with the offered key's fingerprint; if it gets in, say what ssh said.
        open_connection(self.board, self.name).close()
        return EdgekitError(f"OpenSSH to board {self.name!r} ({where}) failed: {why}.")

    def session(self, command: str) -> subprocess.Popen[bytes]:
        """A long session (stdin and stdout pipes), e.g. the deploy lock; it ends when its stdin closes."""
        return _piped(self.argv(command))

    def forward(self, port: int) -> subprocess.Popen[bytes]:
        """stdin/stdout joined to 127.0.0.1:``port`` on the board (ssh -W, a direct-tcpip channel)."""
        return _piped(self.argv("-W", f"127.0.0.1:{port}"))

    def alive(self) -> bool:
        return subprocess.run([*self._ssh, "-O", "check", self._host], capture_output=True,
                              stdin=subprocess.DEVNULL).returncode == 0

    @property
    def conn(self) -> Connection:  # type: ignore[override]
        if self._conn is None:
            self._conn = open_connection(self.board, self.name)
        return self._conn

    def reconnect(self) -> None:
        """The next command makes a new master (the lost one has exited); paramiko reconnects on first use."""
        self.close()

    def close(self) -> None:
        """Closes the paramiko connection if one was opened; the master is closed with its control dir."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def _piped(argv: list[str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


class ProcStream:
    """A socket-like face on an ``ssh -W`` process, for http.client; killed at ``timeout``."""

    def __init__(self, proc: subprocess.Popen[bytes], timeout: float) -> None:
        self.proc, self.deadline = proc, time.monotonic() + timeout
        self._timer = threading.Timer(timeout, proc.kill)  # the read then ends, and the request fails
        self._timer.daemon = True
        self._timer.start()

    def sendall(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def refused(self) -> bool:
        """The board refused the forward (nothing listens on the port): ssh ended with its 255."""
        try:
            return self.proc.wait(1.0) == 255
        except subprocess.TimeoutExpired:
            return False

    def makefile(self, mode: str = "rb", *_: object, **__: object) -> IO[bytes]:
        assert self.proc.stdout is not None
        return self.proc.stdout

    def close(self) -> None:
        self._timer.cancel()
        with contextlib.suppress(OSError):
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        try:
            self.proc.wait(max(0.1, min(5.0, self.deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _short_tmp() -> str:
    # Unix socket paths are limited to ~108 bytes: keep the control dir short.
    return "/tmp" if os.path.isdir("/tmp") and os.access("/tmp", os.W_OK) else tempfile.gettempdir()


def close_masters(control_dir: Path) -> None:
    """Tell every master in ``control_dir`` to exit (ControlPersist outlives its clients): all at once,
    since each request is an ssh process and a fleet has a master per board."""
    asked = []
    for sock in control_dir.iterdir():
        with contextlib.suppress(OSError):
            asked.append(subprocess.Popen(["ssh", "-o", f"ControlPath={sock}", "-O", "exit", "edgekit-fleet"],
                                          stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                          stderr=subprocess.DEVNULL))
    for proc in asked:
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextlib.contextmanager
def control_dir() -> Iterator[Path]:
    """A fresh directory for one run's control sockets; its masters closed and it removed at the end."""
    path = Path(tempfile.mkdtemp(prefix="ek-cp-", dir=_short_tmp()))
    try:
        yield path
    finally:
        close_masters(path)
        shutil.rmtree(path, ignore_errors=True)
