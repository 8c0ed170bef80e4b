"""`edgekit bench --power-modes` on a simulated board (real sshd, real llama-server, real cgroup caps).

The simulated nvpmodel caps the board's services at each mode's CPU ceiling (a cpu cgroup) and its power
updater scales watts with it, so a lower mode is measurably slower and draws less. The board's mode and
clocks are put back at the end, and also when edgekit is killed mid-run (the board-side guard).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from build_helpers import sdist_or_skip
from cli_helpers import EDGEKIT, edgekit, ok_json

from edgekit.sim.testing import SimBoard


def _mode(board: SimBoard) -> str:
    return (board.root / "var/lib/nvpmodel/status").read_text().split()[0]


def _caps_enforced() -> bool:
    return os.access("/sys/fs/cgroup/cpu/cpu.cfs_quota_us", os.W_OK) or "cpu" in (
        Path("/sys/fs/cgroup/cgroup.subtree_control").read_text().split()
        if Path("/sys/fs/cgroup/cgroup.subtree_control").exists() else [])


@pytest.fixture(scope="module")
def env(sim_session) -> dict[str, str]:  # type: ignore[no-untyped-def]
    return {**os.environ, **sim_session.env, "EDGEKIT_LLAMA_SRC": str(sdist_or_skip())}


@pytest.fixture(scope="module")
def board(sim_session, env: dict[str, str]) -> SimBoard:  # type: ignore[no-untyped-def]
    (b,) = sim_session.boards(1, "orin", fresh=True)
    ok_json(edgekit("--json", "deploy", "--board", b.name, "--recipe", "sim-tiny-mtp", env=env))
    return b


@pytest.mark.skipif(not _caps_enforced(), reason="no writable cpu cgroup here: the simulated modes would not differ")
def test_two_modes_differ_and_the_board_is_put_back(board: SimBoard, env: dict[str, str], tmp_path: Path) -> None:
    assert _mode(board) == "pmode:0000"
    out = tmp_path / "modes"
    doc = ok_json(edgekit("--json", "bench", "--board", board.name, "--recipe", "sim-tiny-mtp", "--quick",
                          "--n-gen", "64", "--ignore-eos", "--no-llama-bench", "--concurrency", "1",
                          "--power-modes", "0,15W", "--lock-clocks", "--out", str(out), env=env))
    assert [(m["mode"], m["mode_name"]) for m in doc["modes"]] == [(0, "MAXN"), (3, "15W")]
    assert all(m["clocks_locked"] is True and m["power_available"] for m in doc["modes"])
    for m in doc["modes"]:  # each mode's own bench, recorded at that mode
        res = json.loads(Path(m["results"]).read_text())
        assert res["board"]["nvpmodel"]["name"] == m["mode_name"] and res["board"]["clocks_locked"] is True
    at = {(p["mode_name"], p["config"], p["concurrency"]): p for p in doc["table"]}
    for (mode, config, c), low in at.items():
        if mode != "15W":
            continue
        top = at[("MAXN", config, c)]
        print(f"\n{config} c={c}: MAXN {top['tokens_per_second']:.1f} tok/s {top['average_watts']:.2f} W "
              f"{top['joules_per_token']:.4f} J/token; 15W {low['tokens_per_second']:.1f} tok/s "
              f"{low['average_watts']:.2f} W {low['joules_per_token']:.4f} J/token")
        assert low["tokens_per_second"] < 0.8 * top["tokens_per_second"]  # capped at 0.51 of a core
        assert low["average_watts"] < top["average_watts"]
    assert doc["front"] and all(p["front"] for p in doc["front"])
    assert (out / "modes.md").read_text().count("| 3 (15W) |") == len([k for k in at if k[0] == "15W"])
    assert (out / "pareto.png").read_bytes()[:4] == b"\x89PNG"
    # Put back: the mode, the clocks (scaling_min below max again), no work dir left.
    assert _mode(board) == "pmode:0000"
    cpu0 = board.root / "sys/devices/system/cpu/cpu0/cpufreq"
    assert (cpu0 / "scaling_min_freq").read_text() != (cpu0 / "scaling_max_freq").read_text()
    assert not list((board.base / "bench").glob("modes-*"))


def test_a_killed_run_still_gets_its_mode_back(board: SimBoard, env: dict[str, str], tmp_path: Path) -> None:
    proc = subprocess.Popen([*EDGEKIT, "bench", "--board", board.name, "--recipe",
                             "sim-tiny-mtp", "--n-gen", "400", "--ignore-eos", "--no-llama-bench", "--no-power",
                             "--power-modes", "30W", "--out", str(tmp_path / "killed")], env=env,
                            stdout=subprocess.DEVNULL, stderr=(tmp_path / "stderr").open("w"))
    try:
        deadline = time.monotonic() + 120
        while _mode(board) != "pmode:0002" and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.2)
        assert _mode(board) == "pmode:0002", (tmp_path / "stderr").read_text()[-2000:]
        time.sleep(2)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        deadline = time.monotonic() + 60  # sshd sees the dead connection, closes the guard's channel
        while _mode(board) != "pmode:0000" and time.monotonic() < deadline:
            time.sleep(0.5)
        print(f"\nkilled at 30W: MAXN again {60 - (deadline - time.monotonic()):.1f} s later")
        assert _mode(board) == "pmode:0000"
    finally:
        if proc.poll() is None:
            proc.kill()
        board.run("systemctl stop edgekit-bench.service; systemctl start edgekit-serve.service", timeout=120)


def test_an_unknown_mode_is_one_sentence_and_changes_nothing(board: SimBoard, env: dict[str, str]) -> None:
    res = edgekit("bench", "--board", board.name, "--recipe", "sim-tiny-mtp", "--power-modes", "0,7W", env=env)
    assert res.returncode != 0 and "has no power mode '7W'; its nvpmodel modes: 0 (MAXN), 1 (50W)" in res.stderr
    assert _mode(board) == "pmode:0000"


@pytest.mark.skipif(not _caps_enforced(), reason="no writable cpu cgroup here: the simulated modes would not differ")
def test_tune_over_modes_picks_a_mode_and_leaves_the_board_there(board: SimBoard, env: dict[str, str],
                                                                 tmp_path: Path) -> None:
    try:
        res = edgekit("tune", "--board", board.name, "--recipe", "sim-tiny-mtp", "--quick", "--draft-n", "2",
                      "--objective", "energy", "--min-gain", "0.05", "--power-modes", "50W,15W",
                      "--out", str(tmp_path / "tune"), env=env)
        assert res.returncode == 0, res.stderr[-3000:]
        result = json.loads((tmp_path / "tune" / "tune.json").read_text())
        by_mode = {m["mode_name"]: m["best"]["joules_per_token"]["mean"] for m in result["modes"]}
        print(f"\ntune over modes, J/token of each mode's best: {by_mode}; {result['message']}")
        assert set(by_mode) == {"50W", "15W"}
        chosen = result["power_mode"]
        assert chosen["kept"] and by_mode[chosen["name"]] == min(by_mode.values())
        assert _mode(board) == f"pmode:{chosen['id']:04d}"  # left at the chosen mode, not the one it had (0)
        assert result["deployed"]["health"]["ok"] and "The board stays at power mode" in " ".join(res.stdout.split())
    finally:
        board.run("nvpmodel -m 0", timeout=60)
