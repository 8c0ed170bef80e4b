"""Downloads from PyPI through pip itself (the only registry client edgekit relies on)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from edgekit.errors import EdgekitError


def pip_download(requirements: list[str], dest: Path, extra: list[str]) -> None:
    """`pip download --no-deps` into ``dest``; one clear sentence when it fails."""
    dest.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
            "-d", str(dest), *extra, *requirements]
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        lines = [ln for ln in proc.stderr.splitlines() if ln.strip()] or ["no output"]
        raise EdgekitError(f"pip could not download {', '.join(requirements)}: {lines[-1].strip()}")
