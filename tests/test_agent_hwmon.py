"""The agent's hwmon path for real: a synthetic INA3221 / INA238 tree moved by a scripted trace, the
sampler run as the board runs it (a subprocess, stopped with SIGTERM), energy integrated from its
file and compared with the trace's known integral."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_agent_support import (
    AGENT,
    RAMP_UNTIL,
    TraceWriter,
    agent_env,
    ina238,
    ina3221,
    run_agent,
    set_ina238,
    set_ina3221,
    start_agent,
    step_ramp,
    step_ramp_joules,
    stop_agent,
    wait_for_samples,
)

from edgekit.agent import energy, hwmon
from edgekit.agent.fs import ROOT_ENV


def _orin_nx(root: Path) -> dict[str, tuple[Path, Path]]:
    return ina3221(root, "1-0040", ["VDD_IN", "VDD_CPU_GPU_CV", "VDD_SOC"])


def _thor(root: Path) -> Path:
    return ina238(root, "2-0044", "VIN")


@pytest.mark.parametrize("board", ["orin-nx", "thor"])
def test_sampler_integrates_a_known_trace_within_1_percent(tmp_path: Path, board: str) -> None:
    root = tmp_path / "root"
    low, high = (10.0, 20.0) if board == "orin-nx" else (18.0, 40.0)
    t0 = time.monotonic() + 1.0  # the trace starts once the sampler is surely running
    if board == "orin-nx":
        files = _orin_nx(root)
        setters = [lambda tau: set_ina3221(files["VDD_IN"], step_ramp(tau, low, high)),
                   lambda tau: set_ina3221(files["VDD_CPU_GPU_CV"], 1.0),
                   lambda tau: set_ina3221(files["VDD_SOC"], 2.0)]
        total = "VDD_IN"
    else:
        power = _thor(root)
        setters = [lambda tau: set_ina238(power, step_ramp(tau, low, high))]
        total = "VIN"
    out = tmp_path / "samples.jsonl"
    with TraceWriter(setters, t0):
        proc = start_agent(["sample", "--out", str(out), "--hz", "20"], root)
        try:
            wait_for_samples(out, t0 + RAMP_UNTIL + 0.6, proc)
        finally:
            rc, stdout, stderr = stop_agent(proc, signal.SIGTERM)
    assert rc == 0, stderr
    summary = json.loads(stdout)
    assert summary["source"] == "hwmon" and summary["total_rail"] == total and summary["reason"] == "SIGTERM"

    meta, samples, end = energy.read_samples(str(out))
    assert meta["source"] == "hwmon" and meta["total_is_sum"] is False
    assert end is not None and end["reason"] == "SIGTERM"
    a, b = t0 + 0.25, t0 + RAMP_UNTIL + 0.5  # the step, the hold, the ramp and a bit either side
    win = energy.window_energy(samples, a, b)
    expected = step_ramp_joules(a - t0, b - t0, low, high)
    assert win.energy_j == pytest.approx(expected, rel=0.01)
    assert win.mean_power_w == pytest.approx(expected / (b - a), rel=0.01)
    assert win.sampling_rate_hz is not None and win.sampling_rate_hz >= 10.0
    assert win.max_gap_s is not None and win.max_gap_s < 0.25
    if board == "orin-nx":  # the other rails are there too, and integrate to their constant power
        assert win.rails_energy_j["VDD_SOC"] == pytest.approx(2.0 * (b - a), rel=0.01)


def test_discovery_skips_nc_and_the_sum_channel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "root"
    ina3221(root, "1-0040", ["VDD_GPU_SOC", "VDD_CPU_CV", "VIN_SYS_5V0"], hwmon=3)
    second = ina3221(root, "1-0041", ["NC", "VDDQ_VDD2_1V8AO", "NC"], hwmon=4)  # AGX Orin's second chip
    set_ina3221(second["VDDQ_VDD2_1V8AO"], 0.3, mv=1800)
    ina238(root, "2-0044", "VIN", hwmon=5)
    (root / "sys/bus/i2c/devices/0-0050").mkdir(parents=True)  # an EEPROM: no name file → ignored
    monkeypatch.setenv(ROOT_ENV, str(root))
    rails = hwmon.discover()
    assert [r.label for r in rails] == ["VDD_GPU_SOC", "VDD_CPU_CV", "VIN_SYS_5V0", "VDDQ_VDD2_1V8AO", "VIN"]
    values = hwmon.read(rails)
    assert values["VDDQ_VDD2_1V8AO"] == pytest.approx(300.0, abs=1.0)
    assert [r.chip for r in rails][-1] == "ina238"


def test_no_total_rail_sums_the_rails_and_says_so(tmp_path: Path) -> None:
    root = tmp_path / "root"
    files = ina3221(root, "1-0040", ["VDD_GPU", "VDD_CPU"])
    set_ina3221(files["VDD_GPU"], 3.0)
    set_ina3221(files["VDD_CPU"], 2.0)
    out = tmp_path / "s.jsonl"
    res = run_agent(["sample", "--out", str(out), "--hz", "20", "--duration", "0.5"], root)
    assert res.returncode == 0, res.stderr
    meta, samples, _ = energy.read_samples(str(out))
    assert meta["total_is_sum"] is True and meta["total_rail"] is None and "sum" in meta["total_note"]
    assert samples and all(s["total_mw"] == pytest.approx(5000.0) for s in samples)


def test_total_rail_override(tmp_path: Path) -> None:
    root = tmp_path / "root"
    files = _orin_nx(root)
    for label, w in (("VDD_IN", 7.0), ("VDD_CPU_GPU_CV", 1.0), ("VDD_SOC", 2.0)):
        set_ina3221(files[label], w)
    res = run_agent(["snapshot", "--total-rail", "sum"], root)
    assert res.returncode == 0, res.stderr
    power = json.loads(res.stdout)["power"]
    assert power["total_is_sum"] is True and power["total_mw"] == pytest.approx(10000.0)


def test_no_power_source_is_reported_cleanly(tmp_path: Path) -> None:
    root = tmp_path / "bare"  # no i2c devices, no jtop socket, and no tegrastats on PATH
    root.mkdir()
    out = tmp_path / "s.jsonl"
    res = run_agent(["sample", "--out", str(out), "--duration", "1"], root, path_prefix=None)
    assert res.returncode == 0, res.stderr
    summary = json.loads(res.stdout)
    assert summary["power"] == "unavailable"
    assert set(summary["reasons"]) == {"jtop", "hwmon", "tegrastats"}
    meta, samples, end = energy.read_samples(str(out))
    assert meta["power"] == "unavailable" and samples == [] and end["reason"] == "power unavailable"
    idle = json.loads(run_agent(["idle", "--seconds", "1"], root).stdout)
    assert idle == {"power": "unavailable", "reasons": idle["reasons"], "static_power_baseline_watts": None}
    res = run_agent(["energy", str(out)], root)
    assert res.returncode == 0 and json.loads(res.stdout)["power"] == "unavailable"
    snap = json.loads(run_agent(["snapshot"], root).stdout)
    assert snap["power"]["power"] == "unavailable" and snap["temperatures_c"] == {} and snap["nvpmodel"] is None


def test_idle_baseline(tmp_path: Path) -> None:
    root = tmp_path / "root"
    power = _thor(root)
    set_ina238(power, 18.5)
    res = run_agent(["idle", "--seconds", "1", "--hz", "20"], root)
    assert res.returncode == 0, res.stderr
    idle = json.loads(res.stdout)
    assert idle["static_power_baseline_watts"] == pytest.approx(18.5, rel=1e-3)
    assert idle["sampling_rate_hz"] >= 10 and idle["total_rail"] == "VIN"


def test_sigint_stops_too_and_the_file_is_complete(tmp_path: Path) -> None:
    root = tmp_path / "root"
    set_ina238(_thor(root), 20.0)
    out = tmp_path / "s.jsonl"
    proc = start_agent(["sample", "--out", str(out), "--hz", "50"], root)
    try:
        wait_for_samples(out, time.monotonic() + 0.3, proc)
    finally:
        rc, _, err = stop_agent(proc, signal.SIGINT)
    assert rc == 0, err
    lines = out.read_text().splitlines()
    assert json.loads(lines[-1])["end"]["reason"] == "SIGINT"
    assert all(json.loads(ln) for ln in lines)  # every line whole


def test_nohup_sampler_outlives_sighup(tmp_path: Path) -> None:
    # Started with `nohup ... &` over SSH, the sampler must survive the session's hang-up.
    root = tmp_path / "root"
    set_ina238(_thor(root), 20.0)
    out = tmp_path / "s.jsonl"
    proc = subprocess.Popen(["nohup", sys.executable, str(AGENT), "sample", "--out", str(out)],
                            env=agent_env(root), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for_samples(out, time.monotonic() + 0.2, proc)
        proc.send_signal(signal.SIGHUP)
        time.sleep(0.3)
        assert proc.poll() is None
    finally:
        rc, _, err = stop_agent(proc, signal.SIGTERM)
    assert rc == 0, err
    assert json.loads(out.read_text().splitlines()[-1])["end"]["reason"] == "SIGTERM"


def test_bad_arguments_exit_2(tmp_path: Path) -> None:
    res = run_agent(["sample", "--out", str(tmp_path / "x"), "--hz", "0"], tmp_path)
    assert res.returncode == 2 and "must be positive" in res.stderr
    res = run_agent(["energy", str(tmp_path / "missing.jsonl")], tmp_path)
    assert res.returncode == 2 and "cannot read" in res.stderr
