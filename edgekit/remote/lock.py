"""One deploy per board at a time: an flock held on the board for as long as our SSH session lives.

The lock is held by a remote `flock … cat` reading our channel; if edgekit dies (even SIGKILL),
sshd closes the channel, `cat` ends and the lock is released, so a killed deploy never wedges
the board. A process edgekit starts to work on the board (the fleet's ansible-playbook) can hold the
lock too (``holder_fd``): it is released only when both have ended.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import select
import shlex
import subprocess
import time
from pathlib import Path

import paramiko

from edgekit.errors import EdgekitError
from edgekit.remote.mux import MuxRunner
from edgekit.remote.runner import LocalRunner, SshRunner

# Once the deploy lock is ours, an activation still running on the board (its deploy was killed, or its link cut)
# is waited for too (.activate.lock, held by agent/activate.py), so its prune cannot race our push; exit 75 if
# it does not end in time.
_LOCK_SH = ('mkdir -p "$1" && exec flock -w "$2" "$1/.deploy.lock" sh -c '
            '\'flock -w "$(($2 + 20))" "$1/.activate.lock" true || exit 75; echo locked; exec cat >/dev/null\' '
            'edgekit-lock "$1" "$2"')


class BoardBusy(EdgekitError):
    """Another deploy (or a finishing activation) holds the board."""


class BoardLock:
    def __init__(self, runner: SshRunner | LocalRunner, base: str, wait_s: int = 0) -> None:
        self.runner, self.base, self.wait_s = runner, base, wait_s
        self._chan = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._fd: int | None = None

    def _command(self) -> str:
        return shlex.join(["sh", "-c", _LOCK_SH, "edgekit-lock", self.base, str(self.wait_s)])

    def _refused(self, code: int | None, stderr: bytes) -> EdgekitError:
        if code == 127 or b"not found" in stderr:
            return EdgekitError(f"Board {self.runner.name!r} has no `flock` (util-linux); install it there.")
        if code == 75:
            return BoardBusy(f"An activation is still finishing on board {self.runner.name!r} "
                                f"({self.base}/.activate.lock); try again in a minute or pass --wait SECONDS.")
        return BoardBusy(
            f"Another deploy holds board {self.runner.name!r} ({self.base}/.deploy.lock); "
            "wait for it to finish or pass --wait SECONDS."
        )

    def __enter__(self) -> BoardLock:
        if isinstance(self.runner, LocalRunner):
            return self._local()
        if isinstance(self.runner, MuxRunner):
            return self._session()
        chan = self.runner.conn.transport.open_session()
        chan.exec_command(self._command())
        buf = b""
        deadline = time.monotonic() + self.wait_s + 30
        while b"\n" not in buf and time.monotonic() < deadline:
            if chan.recv_ready():
                buf += chan.recv(64)
            elif chan.exit_status_ready():
                break
            else:
                time.sleep(0.02)
        if not buf.startswith(b"locked"):
            code = chan.recv_exit_status() if chan.exit_status_ready() else None
            chan.close()
            raise self._refused(code, chan.recv_stderr(4096))
        self._chan = chan
        return self

    def _session(self) -> BoardLock:
        # A session of the board's OpenSSH master. Not tied to this thread (the fleet locks from worker
        # threads that end): if edgekit dies, the kernel closes the pipe, ssh sends EOF, `cat` ends.
        assert isinstance(self.runner, MuxRunner)
        proc = self.runner.session(self._command())
        assert proc.stdout is not None and proc.stderr is not None
        line = b""
        deadline = time.monotonic() + self.wait_s + 30
        while not line.endswith(b"\n") and (left := deadline - time.monotonic()) > 0:
            if not select.select([proc.stdout], [], [], left)[0]:
                break
            byte = os.read(proc.stdout.fileno(), 1)
            if not byte:
                break
            line += byte
        if not line.startswith(b"locked"):
            proc.kill()
            _, err = proc.communicate()
            raise self._refused(proc.returncode, err)
        self._proc = proc
        return self

    def holder_fd(self) -> int | None:
        """A descriptor that keeps the lock held while any process has it open (pass it to a child that
        works on the board, so the lock outlives a killed edgekit until that child ends): the write end
        of the lock session's stdin, or the local lock file. None for a paramiko channel."""
        if self._proc is not None and self._proc.stdin is not None:
            return self._proc.stdin.fileno()
        return self._fd

    def _local(self) -> BoardLock:
        base = Path(os.path.expanduser(self.base))
        base.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(base / ".deploy.lock", os.O_RDWR | os.O_CREAT, 0o644)
        deadline = time.monotonic() + self.wait_s
        while True:
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    os.close(self._fd)
                    raise EdgekitError(f"Another deploy holds {base}/.deploy.lock.") from None
                time.sleep(0.2)
        # An activation its killed deploy left running on this board finishes first (see _LOCK_SH).
        act = os.open(base / ".activate.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            while True:
                try:
                    fcntl.flock(act, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    return self
                except BlockingIOError:
                    if time.monotonic() >= deadline + 20:
                        os.close(self._fd)
                        raise EdgekitError(f"An activation is still finishing in {base} (.activate.lock).") from None
                    time.sleep(0.2)
        finally:
            os.close(act)

    def __exit__(self, *exc: object) -> None:
        if self._proc is not None:
            self._proc.stdin.close()  # type: ignore[union-attr]  # EOF to `cat`: the remote flock ends
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        if self._chan is not None:
            with contextlib.suppress(OSError, EOFError, paramiko.SSHException):  # a lost link ended it already
                self._chan.shutdown_write()  # EOF to `cat`: the remote flock ends
                self._chan.close()
        if self._fd is not None:
            os.close(self._fd)
