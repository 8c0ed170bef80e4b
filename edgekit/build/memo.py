"""Remember facts about files (a tarball's sha256, a compiler's version) until the file changes.

A cached build must be found in well under a second; hashing a 77 MB sdist or starting four
compilers for `--version` on every call would eat most of that.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

from edgekit.paths import cache_dir


def _memo_file() -> Path:
    return cache_dir() / "memo.json"


def _load() -> dict[str, str]:
    try:
        return json.loads(_memo_file().read_text())
    except (OSError, ValueError):
        return {}


def remember(kind: str, path: Path, compute: Callable[[], str]) -> str:
    """``compute()`` once per (kind, real path, size, mtime) of ``path``."""
    real = Path(path).resolve()
    st = real.stat()
    key = f"{kind}:{real}:{st.st_size}:{st.st_mtime_ns}"
    memo = _load()
    if key in memo:
        return memo[key]
    value = compute()
    memo[key] = value
    target = _memo_file()
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".memo-", dir=target.parent)
    with os.fdopen(fd, "w") as fh:
        json.dump(memo, fh)
    os.replace(tmp, target)  # concurrent writers: last one wins, every entry stays recomputable
    return value
