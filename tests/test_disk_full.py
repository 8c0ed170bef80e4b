"""A disk that fills during a push (not before it: the preflight would refuse): one sentence, the old release
still serving, no partial file under a final name, and once space is freed the next deploy sends only the rest.
The board's base lives on a tmpfs of its own (edgekit.sim.faults.small_disk), which needs root."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time

import pytest
from cli_helpers import EDGEKIT, edgekit, ok_json

from edgekit.sim import faults

pytestmark = pytest.mark.skipif(not faults.can_mount(), reason="needs root to mount a tmpfs (small_disk)")


def test_a_disk_that_fills_mid_push_leaves_the_old_release_serving_and_the_next_deploy_resumes(sim_session) -> None:
    env = {**os.environ, **sim_session.env}
    (board,) = sim_session.boards(1, fresh=True)
    with faults.small_disk(board, 480):
        first = ok_json(edgekit("--json", "deploy", "--board", board.name, "--recipe", "sim-tiny-mtp", env=env))
        serving = first["release"]
        deploying = subprocess.Popen([*EDGEKIT, "--json", "deploy", "--board", board.name,
                                      "--recipe", "sim-gemma3-270m"], env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        filled: list[int] = []

        def fill_mid_blob() -> None:  # once 50 MB of the 274 MB model have landed
            while deploying.poll() is None:
                if any(p.stat().st_size > 50e6 for p in (board.base / "store").glob("*.part")):
                    filled.append(faults.fill_disk(board))
                    return
                time.sleep(0.01)

        threading.Thread(target=fill_mid_blob, daemon=True).start()
        _, err = deploying.communicate(timeout=600)
        assert filled and deploying.returncode == 2 and "Traceback" not in err, err[-3000:]
        last = err.strip().splitlines()[-1]
        assert "ran out of disk space" in last and "nothing was activated" in last, err[-2000:]
        assert os.readlink(board.base / "current") == f"releases/{serving}"
        assert faults.violations(board) == []  # serving, checked, and every blob under its name verified
        kept = sum(p.stat().st_size for p in (board.base / "store").glob("*.part"))
        print(f"disk filled ({filled[0] / 1e6:.0f} MB taken) after {kept / 1e6:.1f} MB of the model had landed")

        faults.free_disk(board)
        again = ok_json(edgekit("--json", "deploy", "--board", board.name, "--recipe", "sim-gemma3-270m", env=env))
        assert again["changed"] and faults.violations(board) == [] and not list((board.base / "store").glob("*.part"))
        model = max(p.stat().st_size for p in (board.base / "store").iterdir())
        assert again["bytes_sent"] <= model - kept + 2e6, json.dumps(again)  # the rest, + the small blobs
        board.run("systemctl stop edgekit-watchdog.service edgekit-serve.service", timeout=120)  # before its disk goes
