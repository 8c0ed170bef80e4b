"""A push that outlives a broken link: reconnect, take the board's lock again, resume from what arrived.

A cut or stalled link ends the push with ``LinkLost`` (a stall once ``board.stall_s`` passes without a byte:
ssh's keep-alives, the SFTP read timeout). The deploy lock lived on the lost connection, so it is taken
again before anything more is sent — if another deploy took the board in between, this one stops there.
The board kept every byte that reached its disk (``<sha>.part``): the next attempt sends only the rest.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable

from edgekit.errors import EdgekitError, LinkLost
from edgekit.release.plan import ReleasePlan
from edgekit.remote.lock import BoardBusy, BoardLock
from edgekit.remote.runner import SshRunner
from edgekit.remote.transfer import PushReport, TransferProgress, push_blobs

RETRY_WAITS_S = (1.0, 4.0, 15.0)  # before each new attempt: a brief drop, then a router's restart
# The lost connection's lock session ends when the board's sshd gives up on it (ClientAliveInterval ×
# ClientAliveCountMax: docs/deploy.md recommends 15 s × 4); the new lock waits at least this long for it.
RELOCK_WAIT_S = 90


def push_with_retries(runner: SshRunner, base: str, plan: ReleasePlan, stack: contextlib.ExitStack, wait_s: int,
                      say: Callable[[str], None], progress: TransferProgress | None,
                      waits: tuple[float, ...] = RETRY_WAITS_S, recheck_for: str | None = None) -> PushReport:
    """Take the board's lock (held on ``stack``) and push ``plan``'s blobs, resuming after a lost link
    (``recheck_for``: see ``push_blobs``)."""
    stack.enter_context(BoardLock(runner, base, wait_s))
    retries = 0
    while True:
        try:
            report = push_blobs(runner, base, plan.blobs, progress=progress, recheck_for=recheck_for)
            report.retries = retries
            return report
        except LinkLost as exc:
            lost = exc
        while True:  # the link is gone: wait, reconnect, lock again
            if retries == len(waits):
                raise EdgekitError(f"{lost.message.rstrip('.')}; gave up after {retries} retries — run the push "
                                   "again to resume where it stopped.")
            say(f"the link broke ({lost.message.rstrip('.')}); resuming in {waits[retries]:.0f} s "
                f"(retry {retries + 1} of {len(waits)})")
            time.sleep(waits[retries])
            retries += 1
            try:
                runner.reconnect()
                stack.enter_context(BoardLock(runner, base, max(wait_s, RELOCK_WAIT_S)))
                break
            except BoardBusy:
                raise  # another deploy took the board while the link was down: it is theirs now
            except EdgekitError as exc:  # unreachable still: the next wait
                lost = exc if isinstance(exc, LinkLost) else LinkLost(exc.message)
