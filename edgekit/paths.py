"""Where edgekit keeps its files on the workstation (XDG layout, overridable for tests and CI)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path


def _xdg(var: str, default: str) -> Path:
    value = os.environ.get(var)
    return Path(value) if value else Path.home() / default


def config_dir() -> Path:
    """Directory of the user's edgekit.yaml and known_hosts (env EDGEKIT_CONFIG_DIR overrides)."""
    if os.environ.get("EDGEKIT_CONFIG_DIR"):
        return Path(os.environ["EDGEKIT_CONFIG_DIR"])
    return _xdg("XDG_CONFIG_HOME", ".config") / "edgekit"


def logs_dir() -> Path:
    """Logs a failed step points the user at (kept after the step's temp dir is gone)."""
    return cache_dir() / "logs"


def cache_dir() -> Path:
    """Build trees, sources, sim boards (env EDGEKIT_CACHE overrides)."""
    if os.environ.get("EDGEKIT_CACHE"):
        return Path(os.environ["EDGEKIT_CACHE"])
    return _xdg("XDG_CACHE_HOME", ".cache") / "edgekit"


def store_dir() -> Path:
    """The local content-addressed artifact store (env EDGEKIT_STORE overrides)."""
    if os.environ.get("EDGEKIT_STORE"):
        return Path(os.environ["EDGEKIT_STORE"])
    return cache_dir() / "store"


def known_hosts_file() -> Path:
    """edgekit's own known_hosts: separate from ~/.ssh so trust is explicit per board."""
    return config_dir() / "known_hosts"


def sim_dir() -> Path:
    """Simulated boards' state (env EDGEKIT_SIM_DIR overrides: tests keep theirs apart)."""
    if os.environ.get("EDGEKIT_SIM_DIR"):
        return Path(os.environ["EDGEKIT_SIM_DIR"])
    return cache_dir() / "sim"


def build_dir_once(final: Path, done: str, make: Callable[[Path], object]) -> Path:
    """``make(tmp)`` into a fresh directory beside ``final``, renamed into place when complete.

    ``final/done`` marks a finished build: later calls (and concurrent ones that lose the rename)
    reuse it, and a failed or interrupted build leaves nothing at ``final``.
    """
    final = Path(final)
    if (final / done).is_file():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=final.parent))
    try:
        make(tmp)
        try:
            os.rename(tmp, final)
        except OSError:  # a concurrent build finished first: keep its copy
            if not (final / done).is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final
