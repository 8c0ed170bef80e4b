"""Running the edgekit CLI from tests: the real command in a subprocess, JSON out."""

from __future__ import annotations

import json
import subprocess
import sys


def edgekit(env: dict[str, str], *args: str, timeout: float = 1200) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "edgekit", *args], capture_output=True, text=True,
                          timeout=timeout, check=False, env=env)


def ok_json(res: subprocess.CompletedProcess) -> dict:
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout)
