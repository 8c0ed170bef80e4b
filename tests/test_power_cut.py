"""Power cuts on a simulated board: every process of the board killed at once (`edgekit sim power-cut`) at
instants spread through a deploy, the deploying edgekit killed with it, then the board booted again (`sim up`
starts its enabled units, as systemd does at boot). Each time the board must come back serving a complete release
that passed its check (the old or the new), `current`, `serving` and the unit agreeing, no blob under its final
name with other bytes (edgekit.sim.faults.violations), and `status` telling the truth; the next deploy finishes
the job."""

from __future__ import annotations

import os
import subprocess
import time

import pytest
from cli_helpers import EDGEKIT, edgekit, ok_json, recipe_variant

from edgekit.sim import boards as sim
from edgekit.sim import faults

# Seconds into the second deploy (≈ 5 s in all for the tiny release, its blobs already in the store): its probe
# and push, the candidate's start and check, the service's restart, the switch.
INSTANTS = (0.7, 1.8, 2.9, 4.0, 5.2)


@pytest.fixture
def env(sim_session) -> dict[str, str]:
    return {**os.environ, **sim_session.env}


def test_a_power_cut_at_any_instant_of_a_deploy_leaves_a_verified_release_serving(sim_session, env, tmp_path) -> None:
    (board,) = sim_session.boards(1, fresh=True)
    old = ok_json(edgekit("--json", "deploy", "--board", board.name, "--recipe",
                          str(recipe_variant(tmp_path, "sim-tiny-before-cut")), env=env))["release"]
    new_recipe = recipe_variant(tmp_path, "sim-tiny-after-cut")
    kept_old = 0
    for delay in INSTANTS:
        deploying = subprocess.Popen([*EDGEKIT, "--json", "deploy", "--board", board.name,
                                      "--recipe", str(new_recipe)], env=env, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        time.sleep(delay)
        assert sim.power_cut(sim_session.sim_dir, board.name) > 0
        deploying.kill()
        deploying.wait()
        assert not faults.answers(board.service_port)  # nothing of the board runs
        sim.up(sim_session.sim_dir, 1, "orin", sim_session.targets)  # boots it

        took, wrong = faults.settle(board, limit=90)
        assert took is not None, f"cut {delay} s into the deploy: {wrong}"
        serving = faults.current(board)
        kept_old += serving == old
        st = ok_json(edgekit("--json", "status", "--board", board.name, env=env))
        assert st["current"] == serving and st["serving"] == serving
        assert st["service_active"] and st["health"]["ok"], st["health"]

    print(f"after the cuts the board served the old release {kept_old}× of {len(INSTANTS)}")
    done = ok_json(edgekit("--json", "deploy", "--board", board.name, "--recipe", str(new_recipe), env=env))
    assert done["health"]["ok"] and os.readlink(board.base / "current") == f"releases/{done['release']}"
