"""Board paths and small, failure-tolerant readers.

Every absolute board path goes through :func:`board_path`, so ``$EDGEKIT_BOARD_ROOT`` (a simulated
board's root) and "/" (a real Jetson) are read by the same code.
"""

from __future__ import annotations

import glob
import os
import re

ROOT_ENV = "EDGEKIT_BOARD_ROOT"


def board_root() -> str:
    return os.environ.get(ROOT_ENV, "")


def board_path(path: str) -> str:
    """``/sys/...`` → ``$EDGEKIT_BOARD_ROOT/sys/...`` (unchanged when the variable is unset)."""
    root = board_root().rstrip("/")
    return root + "/" + path.lstrip("/") if root else "/" + path.lstrip("/")


def board_glob(pattern: str) -> list[str]:
    """Sorted matches of an absolute board pattern, naturally ordered (cpu2 before cpu10)."""
    return glob_sorted(board_path(pattern))


def glob_sorted(pattern: str) -> list[str]:
    """Matches of a pattern that is already under the root (e.g. built from a found path)."""
    return sorted(glob.glob(pattern), key=_natural_key)


def _natural_key(path: str) -> list[tuple[int, str]]:
    # Digit runs compare as numbers: zero-padded, so strings compare the way ints would.
    return [(1, part.zfill(12)) if part.isdigit() else (0, part) for part in re.split(r"(\d+)", path)]


def read_text(path: str) -> str | None:
    """The stripped content of a (sysfs) file, or None when it can't be read."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        data = os.read(fd, 4096)  # one read: sysfs attributes are small, and this keeps it cheap
    except OSError:
        return None
    finally:
        os.close(fd)
    return data.decode("utf-8", "replace").strip().strip("\0")


def read_int(path: str) -> int | None:
    text = read_text(path)
    if not text:
        return None
    try:
        return int(text.split()[0])
    except ValueError:
        return None
