"""Heat in every figure: a run the board throttled in is flagged and left out of the summary.

On a simulated board a scripted temperature trace (thermal_trace.json) heats every zone past its passive trip
point while the bench runs; the board's power updater lowers its CPU caps as a kernel would; the sampler's
temperature-and-clock lines show it; the runs inside are flagged, the summary leaves them out, the report says so.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
from build_helpers import sdist_or_skip
from cli_helpers import EDGEKIT, edgekit, ok_json

from edgekit.bench import heat, results
from edgekit.sim.testing import SimBoard


@pytest.fixture(scope="module")
def env(sim_session) -> dict[str, str]:  # type: ignore[no-untyped-def]
    return {**os.environ, **sim_session.env, "EDGEKIT_LLAMA_SRC": str(sdist_or_skip())}


def _wait_for(pattern: str, where: Path, proc: subprocess.Popen, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while not list(where.glob(pattern)) and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.1)
    assert list(where.glob(pattern)), f"{pattern} never appeared under {where}"


def test_runs_in_a_throttled_window_are_flagged_and_left_out(sim_session, env: dict[str, str],  # type: ignore[no-untyped-def]
                                                            tmp_path: Path) -> None:
    (board,) = sim_session.boards(1, "orin", fresh=True)
    board_: SimBoard = board
    ok_json(edgekit("--json", "deploy", "--board", board_.name, "--recipe", "sim-tiny-mtp", env=env))
    out, trace = tmp_path / "out", board_.dir / "thermal_trace.json"
    proc = subprocess.Popen([*EDGEKIT, "--json", "bench", "--board", board_.name, "--recipe",
                             "sim-tiny-mtp", "--quick", "--n-gen", "64", "--ignore-eos", "--no-llama-bench",
                             "--out", str(out)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for("*/load-1.json", board_.base / "bench", proc)  # two runs done: now it heats up
        trace.write_text(json.dumps({"start": time.time(), "points": [[0, 99.0]]}))
        _wait_for("*/load-3.json", board_.base / "bench", proc)
        trace.unlink()  # and cools down again
        stdout, stderr = proc.communicate(timeout=600)
    finally:
        trace.unlink(missing_ok=True)
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, stderr[-3000:]
    doc = json.loads(stdout)
    results.validate(doc)
    hot = [r for r in doc["runs"] if r["throttled"]]
    print(f"\n{len(hot)} of {len(doc['runs'])} runs throttled: {hot[0]['throttled']['reason'] if hot else '-'}")
    assert 1 <= len(hot) < len(doc["runs"]) and not doc["runs"][0]["throttled"]
    assert all("past its throttle point 95.0 °C" in r["throttled"]["reason"] or "clock cap fell" in
               r["throttled"]["reason"] for r in hot)
    assert doc["heat"]["throttled_runs"] == doc["heat"]["left_out"] == len(hot)
    assert doc["heat"]["throttle_points_c"]["cpu-thermal"] == 95.0
    assert sum(p["repetitions"] for p in doc["summary"]["points"]) == len(doc["runs"]) - len(hot)
    assert f"{len(hot)} of {len(doc['runs'])} runs throttled" in (out / "report.md").read_text()
    cpu0 = board_.root / "sys/devices/system/cpu/cpu0/cpufreq"
    deadline = time.monotonic() + 10  # cooled: the caps are back at the mode's ceiling
    while (cpu0 / "scaling_max_freq").read_text() != (cpu0 / "cpuinfo_max_freq").read_text():
        assert time.monotonic() < deadline
        time.sleep(0.2)


def test_a_lowered_clock_cap_flags_a_window_and_keep_throttled_keeps_it() -> None:
    trips = {"cpu-thermal": 95.0}
    states = [{"t": 0.0, "temps_c": {"cpu-thermal": 60.0}, "caps_mhz": {"cpu0": 2201.6, "gpu": 1300.5}},
              {"t": 5.0, "temps_c": {"cpu-thermal": 80.0}, "caps_mhz": {"cpu0": 2201.6, "gpu": 905.0}},
              {"t": 9.0, "temps_c": {"cpu-thermal": 96.0}, "caps_mhz": {"cpu0": 2201.6, "gpu": 1300.5}}]
    assert heat.check(0.0, 4.0, trips, states) is None
    assert heat.check(4.0, 6.0, trips, states)["reason"] == "the gpu clock cap fell to 905 MHz from 1300 MHz"
    assert "cpu-thermal at 96.0 °C" in heat.check(8.0, 10.0, trips, states)["reason"]
    runs = [{"window": {"start": a, "end": b}} for a, b in ((0.0, 4.0), (4.0, 6.0))]
    text = "\n".join(json.dumps(x) for x in [{"meta": {"throttle_points_c": trips}}, *({"state": s} for s in states)])
    assert heat.mark(runs, text) == (1, trips)
    assert heat.kept(runs, keep_throttled=False)[0] == runs[:1]
    assert heat.kept(runs, keep_throttled=True)[0] == runs
