"""A throwaway edgekit world for a benchmark: its own config dir, board file, known_hosts and sim dir."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from edgekit.sim import boards as sim


def isolated(prefix: str) -> tuple[Path, dict[str, str], sim.Targets]:
    """(work dir, environment for `edgekit` subprocesses, where `sim up` publishes the boards)."""
    work = Path(tempfile.mkdtemp(prefix=prefix))
    env = {**os.environ, "EDGEKIT_CONFIG_DIR": str(work / "config"), "EDGEKIT_SIM_DIR": str(work / "sim"),
           "EDGEKIT_CONFIG": str(work / "config" / "edgekit.yaml")}
    if not env.get("EDGEKIT_LLAMA_SRC"):
        from edgekit.build import fetch_sdist

        env["EDGEKIT_LLAMA_SRC"] = str(fetch_sdist())
    return work, env, sim.Targets(Path(env["EDGEKIT_CONFIG"]), Path(env["EDGEKIT_CONFIG_DIR"]) / "known_hosts")


def edgekit(env: dict[str, str], *args: str) -> dict[str, Any]:
    """`edgekit --json ARGS` in ``env``: its JSON, or exit with its error."""
    proc = subprocess.run([sys.executable, "-m", "edgekit", "--json", *args], capture_output=True, text=True,
                          env=env, timeout=3600, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"edgekit {' '.join(args[:3])} failed (exit {proc.returncode}): {proc.stderr[-2000:]}")
    return json.loads(proc.stdout)
