"""The energy integrator: exact on piecewise-linear power, interpolated window edges, honest about
coverage, and the sampler-file loader's tolerance of a torn last line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from edgekit.agent import energy


def _samples(points: list[tuple[float, float]]) -> list[dict]:
    return [{"t": t, "rails": {"VIN": p}, "total_mw": p} for t, p in points]


def test_trapezoid_is_exact_on_linear_power_and_edges_interpolate() -> None:
    pts = [(0.0, 1000.0), (1.0, 3000.0), (2.0, 3000.0), (4.0, 1000.0)]  # mW
    # [0.5, 3.0]: 0.5 s ramp 2000→3000, 1 s at 3000, 1 s ramp 3000→2000.
    assert energy.integrate(pts, 0.5, 3.0) == pytest.approx(0.5 * 2500 + 3000 + 2500)
    assert energy.integrate(pts, 0.0, 4.0) == pytest.approx(2000 + 3000 + 4000)
    assert energy.integrate(pts, 1.25, 1.25) == 0.0
    win = energy.window_energy(_samples(pts), 0.5, 3.0)
    assert win.energy_j == pytest.approx(6.75) and win.mean_power_w == pytest.approx(2.7)
    assert win.samples_in_window == 2 and win.max_gap_s == pytest.approx(2.0)
    assert win.rails_energy_j == {"VIN": pytest.approx(6.75)}


def test_window_must_be_covered() -> None:
    pts = [(10.0, 5000.0), (11.0, 5000.0)]
    with pytest.raises(energy.CoverageError, match="not covered"):
        energy.integrate(pts, 9.9, 11.0)
    with pytest.raises(energy.CoverageError):
        energy.window_energy([], None, None)
    with pytest.raises(ValueError, match="ends before"):
        energy.integrate(pts, 10.8, 10.2)


def test_samples_without_a_total_are_left_out_not_zeroed() -> None:
    samples = _samples([(0.0, 2000.0), (1.0, 2000.0), (2.0, 2000.0)])
    samples[1]["total_mw"] = None  # the total rail failed to read once
    assert energy.window_energy(samples).energy_j == pytest.approx(4.0)


def test_sampling_rate_and_gaps() -> None:
    times = [i * 0.05 for i in range(21)]
    assert energy.sampling_rate_hz(times) == pytest.approx(20.0)
    assert energy.sampling_rate_hz([1.0]) is None
    assert energy.max_gap_s([*times[:10], 0.8, 1.0], 0.0, 1.0) == pytest.approx(0.35)


def test_read_samples_skips_a_torn_last_line(tmp_path: Path) -> None:
    f = tmp_path / "s.jsonl"
    lines = [json.dumps({"meta": {"source": "hwmon"}}), *(json.dumps(s) for s in _samples([(0, 1), (1, 1)]))]
    f.write_text("\n".join(lines) + '\n{"t": 2.0, "rails": {"VI')
    meta, samples, end = energy.read_samples(str(f))
    assert meta == {"source": "hwmon"} and len(samples) == 2 and end is None
