"""The board's own watchdog (agent/watchdog.py, edgekit-watchdog.service) on simulated boards: a server that is
alive but answers nothing (SIGSTOP) is restarted by the board itself, a release that keeps wedging is replaced
by the one served before it, `status` tells both, and the server's log stays under its cap."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest
import yaml
from cli_helpers import edgekit, ok_json

from edgekit.agent.watchdog import cap_logs
from edgekit.sim import faults
from edgekit.sim.testing import SimBoard

REPO = Path(__file__).resolve().parents[1]
# Probes every second, three in a row missed: a wedged server is noticed in seconds, not the default half minute;
# the tiny model loads in about a second, so a restarted server's probes count after 5 s.
FAST = {"every_s": 1, "timeout_s": 1, "failures": 3, "start_grace_s": 5}


@pytest.fixture
def env(sim_session) -> dict[str, str]:
    return {**os.environ, **sim_session.env}


def variant(tmp: Path, name: str, **watchdog: object) -> Path:
    data = yaml.safe_load((REPO / "edgekit" / "data" / "recipes" / "sim-tiny-mtp.yaml").read_text())
    data["name"] = name
    data["runtime"]["watchdog"] = {**FAST, **watchdog}
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def server_process(board: SimBoard) -> psutil.Process:
    found = [p for p in faults.server_processes(board) if any("llama-server" in part for part in p.cmdline())]
    assert found, f"no llama-server runs on {board.name}"
    return found[0]


def wedge_and_wait(board: SimBoard, until: Callable[[], object], limit: float = 120.0) -> float:
    """SIGSTOP the board's server; seconds until ``until()`` holds with /health answering again."""
    stopped = server_process(board)
    stopped.suspend()
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit:
        if until() and faults.answers(board.service_port):
            return time.monotonic() - t0
        time.sleep(0.5)
    said = (board.base / "logs" / "watchdog.log").read_text()
    raise AssertionError(f"the board did not recover in {limit:g} s; the watchdog's log: {said}")


def record(board: SimBoard) -> dict:
    return json.loads((board.base / "watchdog.json").read_text())


def test_a_wedged_server_is_restarted_by_the_board_and_status_says_so(sim_session, env, tmp_path) -> None:
    (board,) = sim_session.boards(1, fresh=True)
    rep = ok_json(edgekit("--json", "deploy", "--board", board.name, "--recipe",
                          str(variant(tmp_path, "sim-tiny-watched")), env=env))
    assert board.run("systemctl is-active edgekit-watchdog.service").rc == 0
    unit = (board.root / "etc/systemd/system/edgekit-watchdog.service").read_text()  # rendered from its spec
    assert "Restart=always" in unit and " watchdog " in unit and rep["release"] in unit

    before = server_process(board).pid
    took = wedge_and_wait(board, lambda: (board.base / "watchdog.json").is_file() and record(board).get("restarts"))
    print(f"wedged server → healthy again in {took:.1f} s")
    assert server_process(board).pid != before
    (restart,) = record(board)["restarts"]
    assert restart["release"] == rep["release"] and restart["reason"], restart
    assert os.readlink(board.base / "current") == f"releases/{rep['release']}"

    st = ok_json(edgekit("--json", "status", "--board", board.name, env=env))
    assert st["health"]["ok"] and len(st["watchdog"]["restarts"]) == 1 and st["watchdog"]["rolled_back"] is None
    assert "1 restart(s)" in edgekit("status", "--board", board.name, env=env).stdout


def test_a_release_that_keeps_wedging_is_replaced_by_the_one_before(sim_session, env, tmp_path) -> None:
    (board,) = sim_session.boards(1, fresh=True)
    good = ok_json(edgekit("--json", "deploy", "--board", board.name, "--recipe",
                           str(variant(tmp_path, "sim-tiny-good")), env=env))
    bad = ok_json(edgekit("--json", "deploy", "--board", board.name, "--recipe",
                          str(variant(tmp_path, "sim-tiny-wedging", restarts=1)), env=env))
    assert bad["release"] != good["release"]
    wedge_and_wait(board, lambda: (board.base / "watchdog.json").is_file() and record(board).get("restarts"))
    # Restarted once within the window already: the next wedge puts the release before it back.
    took = wedge_and_wait(board, lambda: os.readlink(board.base / "current") == f"releases/{good['release']}")
    print(f"second wedge → the release before healthy in {took:.1f} s")
    assert (board.base / "serving").read_text().strip() == good["release"]
    assert f"releases/{good['release']}/" in " ".join(server_process(board).cmdline())
    rolled = record(board)["rolled_back"]
    assert rolled["from"] == bad["release"] and rolled["to"] == good["release"], rolled

    st = ok_json(edgekit("--json", "status", "--board", board.name, env=env))
    assert st["current"] == good["release"] and st["health"]["ok"]
    assert st["watchdog"]["rolled_back"]["to"] == good["release"]


def test_a_log_over_its_cap_is_kept_once_and_truncated_in_place(tmp_path: Path) -> None:
    log, small = tmp_path / "server.log", tmp_path / "other.log"
    with open(log, "ab") as writer:  # the server's side: O_APPEND, as systemd's append: opens it
        writer.write(b"x" * 3000)
        writer.flush()
        small.write_bytes(b"y" * 10)
        cap_logs([str(log), str(small), str(tmp_path / "missing.log"), ""], 1000)
        assert (tmp_path / "server.log.1").read_bytes() == b"x" * 3000 and log.stat().st_size == 0
        writer.write(b"after")
        writer.flush()
    assert log.read_bytes() == b"after"  # written at the new end, no hole of 3000 zero bytes
    assert small.read_bytes() == b"y" * 10 and not (tmp_path / "other.log.1").exists()
