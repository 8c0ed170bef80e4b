"""One deploy per board at a time: an flock held on the board for as long as our SSH session lives.

The lock is held by the agent's ``guard`` reading our channel (remote/channel_guard.py); if edgekit dies (even
SIGKILL), sshd closes the channel, the guard ends and the lock is released, so a killed deploy never wedges the
board. Once the deploy lock is ours, an activation still running on the board (its deploy was killed, or its link
cut) is waited for too (.activate.lock, held by agent/activate.py), so its prune cannot race our push. A process
edgekit starts to work on the board (the fleet's ansible-playbook) can hold the lock too (``holder_fd``): it is
released only when both have ended.
"""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path

from edgekit.errors import EdgekitError
from edgekit.remote.channel_guard import ChannelGuard, GuardRefused, guard_args
from edgekit.remote.runner import LocalRunner, SshRunner

DEPLOY_LOCK = ".deploy.lock"
ACTIVATE_LOCK = ".activate.lock"


class BoardBusy(EdgekitError):
    """Another deploy (or a finishing activation) holds the board."""


class BoardLock:
    def __init__(self, runner: SshRunner | LocalRunner, base: str, wait_s: int = 0) -> None:
        self.runner, self.base, self.wait_s = runner, base, wait_s
        self._guard: ChannelGuard | None = None
        self._fd: int | None = None

    def _refused(self, exc: GuardRefused) -> EdgekitError:
        if exc.busy is None:
            return EdgekitError(exc.message)
        if exc.busy.endswith(ACTIVATE_LOCK):
            return BoardBusy(f"An activation is still finishing on board {self.runner.name!r} "
                             f"({self.base}/{ACTIVATE_LOCK}); try again in a minute or pass --wait SECONDS.")
        return BoardBusy(
            f"Another deploy holds board {self.runner.name!r} ({self.base}/{DEPLOY_LOCK}); "
            "wait for it to finish or pass --wait SECONDS."
        )

    def __enter__(self) -> BoardLock:
        if isinstance(self.runner, LocalRunner):
            return self._local()
        base = self.base.rstrip("/")
        guard = ChannelGuard(self.runner, base, guard_args([f"{base}/{DEPLOY_LOCK}"], self.wait_s,
                                                           f"{base}/{ACTIVATE_LOCK}"),
                             arm_timeout_s=self.wait_s + 30 + 20)
        try:
            self._guard = guard.__enter__()
        except GuardRefused as exc:
            raise self._refused(exc) from None
        return self

    def holder_fd(self) -> int | None:
        """A descriptor that keeps the lock held while any process has it open (pass it to a child that
        works on the board, so the lock outlives a killed edgekit until that child ends): the write end
        of the lock session's stdin, or the local lock file. None for a paramiko channel."""
        if self._guard is not None:
            return self._guard.holder_fd()
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
        # An activation its killed deploy left running on this board finishes first (as the guard waits for it).
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
        if self._guard is not None:
            self._guard.__exit__()
        if self._fd is not None:
            os.close(self._fd)
