"""Running the edgekit CLI from tests: the real command in a subprocess, JSON out."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml

from edgekit.resources import builtin_recipes_dir


def edgekit(env: dict[str, str], *args: str, timeout: float = 1200) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "edgekit", *args], capture_output=True, text=True,
                          timeout=timeout, check=False, env=env)


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
