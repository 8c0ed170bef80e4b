"""Two fleet rollouts over overlapping boards: per board one of them works and the other is refused (or, with
--wait, works after it), never both at once; every board ends serving a release that passed its check."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import psutil
import pytest
from build_helpers import sdist_or_skip
from cli_helpers import EDGEKIT, recipe_variant

from edgekit.config.boardfile import Boards
from edgekit.sim import faults


@pytest.fixture
def env(sim_session) -> dict[str, str]:
    return {**os.environ, **sim_session.env, "EDGEKIT_LLAMA_SRC": str(sdist_or_skip())}


def rollout_cmd(recipe: Path, group: str, *extra: str) -> list[str]:
    return [*EDGEKIT, "--json", "fleet", "rollout", "--recipe", str(recipe), "--group",
            group, "--no-canary", *extra]


def is_playbook(proc: psutil.Process) -> bool:
    try:
        return "ansible-playbook" in " ".join(proc.cmdline()[:2])
    except psutil.Error:  # a child that has just ended
        return False


def playbook_started(proc: subprocess.Popen) -> None:
    """Wait until ``proc`` (a rollout) runs its playbook: it holds its boards' locks by then."""
    me = psutil.Process(proc.pid)
    while not any(is_playbook(c) for c in me.children()):
        assert proc.poll() is None, "the rollout ended before its playbook started"
        time.sleep(0.01)


def test_two_rollouts_over_a_shared_board_never_work_on_it_at_once(sim_session, env, tmp_path) -> None:
    a, shared, c = sim_session.boards(3, fresh=True)
    boards = Boards(Path(sim_session.env["EDGEKIT_CONFIG"]))
    data = boards.load()
    data.groups["first"], data.groups["second"] = [a.name, shared.name], [shared.name, c.name]
    boards.save(data)
    one, two = recipe_variant(tmp_path, "sim-tiny-first"), recipe_variant(tmp_path, "sim-tiny-second")

    first = subprocess.Popen(rollout_cmd(one, "first"), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
    playbook_started(first)
    second = subprocess.run(rollout_cmd(two, "second"), env=env, capture_output=True, text=True, timeout=600)
    out, err = first.communicate(timeout=600)
    assert first.returncode == 0, err[-3000:]
    assert sorted(json.loads(out)["succeeded"]) == sorted([a.name, shared.name])
    refused = json.loads(second.stdout)
    assert second.returncode != 0 and list(refused["succeeded"]) == [c.name], refused
    assert "Another deploy holds board" in refused["failed"][shared.name]["reason"], refused
    assert faults.current(shared).startswith("sim-tiny-first-")

    # With --wait the second takes the shared board once the first has let it go.
    waited = subprocess.run(rollout_cmd(two, "second", "--wait", "300"), env=env, capture_output=True, text=True,
                            timeout=900)
    assert waited.returncode == 0, waited.stderr[-3000:]
    assert faults.current(shared).startswith("sim-tiny-second-")
    for board in (a, shared, c):
        assert faults.violations(board) == [], board.name
