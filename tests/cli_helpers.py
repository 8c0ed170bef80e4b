"""Running the edgekit CLI from tests: the real command in a subprocess, JSON out."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

from edgekit.resources import builtin_recipes_dir

EDGEKIT = [sys.executable, "-m", "edgekit"]  # the command's argv prefix, for a Popen of one in the background


def edgekit(*args: str, env: dict[str, str] | None = None, stdin: str | None = None, timeout: float = 1200,
            cwd: str | os.PathLike[str] | None = None) -> subprocess.CompletedProcess[str]:
    """``edgekit *args`` run to its end, its output captured as text; ``env`` None inherits this process's."""
    return subprocess.run([*EDGEKIT, *args], capture_output=True, text=True, input=stdin, timeout=timeout,
                          check=False, env=env, cwd=cwd)


def ok_json(res: subprocess.CompletedProcess) -> dict:
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout)


def recipe_variant(tmp: Path, name: str, of: str = "sim-tiny-mtp") -> Path:
    """A built-in recipe under another name (so another release id), written to ``tmp``."""
    data = yaml.safe_load((builtin_recipes_dir() / f"{of}.yaml").read_text())
    data["name"] = name
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path
