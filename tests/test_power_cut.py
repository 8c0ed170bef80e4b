"""Power cuts on a simulated board: every process of the board killed at once (`edgekit sim power-cut`) at
instants spread through a deploy, the deploying edgekit killed with it, then the board booted again (`sim up`
starts its enabled units, as systemd does at boot). Each time the board must come back serving a complete release
that passed its check (the old or the new), `current` and the unit agreeing, no blob under its final name with
other bytes, and `status` telling the truth; the next deploy finishes the job."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml
from cli_helpers import edgekit, ok_json

from edgekit.sim import boards as sim
from edgekit.sim.testing import SimBoard

REPO = Path(__file__).resolve().parents[1]
# Seconds into the second deploy (≈ 5 s in all for the tiny release, its blobs already in the store): its probe
# and push, the candidate's start and check, the service's restart, the switch.
INSTANTS = (0.7, 1.8, 2.9, 4.0, 5.2)


@pytest.fixture
def env(sim_session) -> dict[str, str]:
    return {**os.environ, **sim_session.env}


def variant(tmp: Path, name: str) -> Path:
    data = yaml.safe_load((REPO / "edgekit" / "data" / "recipes" / "sim-tiny-mtp.yaml").read_text())
    data["name"] = name
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def answers(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as resp:
            return resp.status == 200
    except OSError:
        return False


def unit_release(board: SimBoard) -> str | None:
    """The release the installed service unit runs."""
    unit = board.root / "etc" / "systemd" / "system" / "edgekit-serve.service"
    prefix = f"WorkingDirectory={board.base}/releases/"
    lines = unit.read_text().splitlines() if unit.is_file() else []
    return next((line[len(prefix):] for line in lines if line.startswith(prefix)), None)


def settled(board: SimBoard, limit: float = 90.0) -> str:
    """The release the booted board serves, once /health answers and the unit runs `current`."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit:
        current = os.readlink(board.base / "current").removeprefix("releases/")
        if answers(board.service_port) and unit_release(board) == current:
            return current
        time.sleep(0.5)
    raise AssertionError(f"{board.name} did not come back serving `current` in {limit:g} s")


def test_a_power_cut_at_any_instant_of_a_deploy_leaves_a_verified_release_serving(sim_session, env, tmp_path) -> None:
    (board,) = sim_session.boards(1, fresh=True)
    old = ok_json(edgekit(env, "--json", "deploy", "--board", board.name, "--recipe",
                          str(variant(tmp_path, "sim-tiny-before-cut"))))["release"]
    new_recipe = variant(tmp_path, "sim-tiny-after-cut")
    kept_old = 0
    for delay in INSTANTS:
        deploying = subprocess.Popen([sys.executable, "-m", "edgekit", "--json", "deploy", "--board", board.name,
                                      "--recipe", str(new_recipe)], env=env, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        time.sleep(delay)
        assert sim.power_cut(sim_session.sim_dir, board.name) > 0
        deploying.kill()
        deploying.wait()
        assert not answers(board.service_port)  # nothing of the board runs
        sim.up(sim_session.sim_dir, 1, "orin", sim_session.targets)  # boots it

        serving = settled(board)
        kept_old += serving == old
        assert serving == old or (board.base / "releases" / serving / "health.json").is_file(), serving
        assert (board.base / "serving").read_text().strip() == serving
        for blob in (board.base / "store").iterdir():  # a partial upload keeps its .part name
            if not blob.name.endswith(".part") and blob.is_file():
                assert hashlib.sha256(blob.read_bytes()).hexdigest() == blob.name, blob
        st = ok_json(edgekit(env, "--json", "status", "--board", board.name))
        assert st["current"] == serving and st["serving"] == serving
        assert st["service_active"] and st["health"]["ok"], st["health"]

    print(f"after the cuts the board served the old release {kept_old}× of {len(INSTANTS)}")
    done = ok_json(edgekit(env, "--json", "deploy", "--board", board.name, "--recipe", str(new_recipe)))
    assert done["health"]["ok"] and os.readlink(board.base / "current") == f"releases/{done['release']}"
