"""Child processes that end when edgekit ends, however it ends.

An ``ssh`` child carrying a blob reads the file itself (sshstream.py): when edgekit was SIGKILLed it went
on sending, finished the blob on the board and renamed its part into place while the next push was
resuming that very part (CI: "No such file or directory: …/<sha>.part"). Linux's parent-death signal
ties the child to us; elsewhere (no prctl) the child is left as before.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Callable

_PR_SET_PDEATHSIG = 1


def _prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


_PRCTL = _prctl()  # resolved here, not in the forked child


def dies_with_us() -> Callable[[], None] | None:
    """A ``preexec_fn`` that SIGKILLs the child when the thread that starts it ends (Linux), else None.

    The signal follows the *thread* that forked: start the child from the thread that waits for it.
    """
    if _PRCTL is None:
        return None
    prctl, parent = _PRCTL, os.getpid()

    def arm() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # we died between the fork and the prctl
            os._exit(1)

    return arm
