"""Power during a bench: the agent's sampler on the board, the idle baseline, energy per window.

The sampler streams raw samples (board-monotonic time, mW per rail) to a file on the board for
the whole bench. Each run's load marks its own window in the same clock, and the host integrates
the raw samples over exactly that window with ``edgekit.agent.energy`` (never jtop's running
``avg``). The static baseline is the mean total power over an idle window before any load.

The total: Orin NX / Nano use VDD_IN and Thor uses VIN (module / carrier input rails). AGX Orin
has no input rail on its monitors: its rails are VDD_GPU_SOC, VDD_CPU_CV, VIN_SYS_5V0 (and
VDDQ_VDD2_1V8AO), and VIN_SYS_5V0 is only the 5 V system rail (rbonghi/jetson_stats#344). jtop
shows their sum as the board's total, so the bench uses the sum there (``total_rail_method``
"sum") and reports every rail's energy beside it.
"""

from __future__ import annotations

import itertools
import json
import time
from dataclasses import dataclass, field
from typing import Any

from edgekit.agent import energy
from edgekit.bench.jobs import Job
from edgekit.config.profiles import BoardProfile

# Boards whose profile's total rail is not the board's input: sum the module's rails instead.
SUM_RAIL_BOARDS = {"VIN_SYS_5V0": "VIN_SYS_5V0 is the 5 V system rail only (jetson_stats#344); the total is "
                                  "the sum of the module rails, as jtop shows it"}


@dataclass(frozen=True)
class TotalRail:
    sampler_arg: str  # what `sample --total-rail` gets: a rail name or "sum"
    method: str  # "sum" | "rail:<NAME>"
    note: str


def total_rail(profile: BoardProfile, override: str | None = None) -> TotalRail:
    if override:
        if override == "sum":
            return TotalRail("sum", "sum", "sum of all rails (--total-rail sum)")
        return TotalRail(override, f"rail:{override}", f"the {override} rail (--total-rail)")
    rail = profile.total_power_rail
    if rail in SUM_RAIL_BOARDS:
        return TotalRail("sum", "sum", SUM_RAIL_BOARDS[rail])
    return TotalRail(rail, f"rail:{rail}", f"{rail}, the board's input rail")


def window_power(samples: list[dict[str, Any]], t0: float, t1: float, tokens: int | None,
                 baseline_w: float | None) -> dict[str, Any]:
    """The power fields of one run's window; ``available: false`` with a reason when not covered."""
    try:
        win = energy.window_energy(samples, t0, t1)
    except energy.CoverageError as exc:
        return {"available": False, "reason": str(exc), "window_start": t0, "window_end": t1}
    out: dict[str, Any] = {
        "available": True, "window_start": round(t0, 6), "window_end": round(t1, 6),
        "duration_s": round(win.duration_s, 6), "total_energy_joules": round(win.energy_j, 6),
        "average_watts": round(win.mean_power_w, 6) if win.mean_power_w is not None else None,
        "samples_in_window": win.samples_in_window,
        "sampling_rate_hz": round(win.sampling_rate_hz, 3) if win.sampling_rate_hz else None,
        "max_gap_s": round(win.max_gap_s, 6) if win.max_gap_s is not None else None,
        "rails_energy_joules": win.rails_energy_j,
        "joules_per_token": round(win.energy_j / tokens, 9) if tokens else None,
    }
    if baseline_w is not None:
        dynamic = win.energy_j - baseline_w * win.duration_s  # what the work added above idle
        out["dynamic_energy_joules"] = round(dynamic, 6)
        out["dynamic_joules_per_token"] = round(dynamic / tokens, 9) if tokens else None
    return out


@dataclass
class PowerLog:
    """The sampler's file, read back: meta, samples and how sampling went."""

    meta: dict[str, Any]
    samples: list[dict[str, Any]]
    end: dict[str, Any] | None
    idle: tuple[float, float] | None = None
    baseline_w: float | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def available(self) -> bool:
        return self.meta.get("power") != "unavailable" and bool(energy.series(self.samples))

    def measure_idle(self, t0: float, t1: float) -> None:
        self.idle = (t0, t1)
        try:
            self.baseline_w = energy.window_energy(self.samples, t0, t1).mean_power_w
        except energy.CoverageError as exc:
            self.notes.append(f"no idle baseline: {exc}")

    def summary(self, rail: TotalRail, run_windows: list[dict[str, Any]]) -> dict[str, Any]:
        if not self.available:
            reasons = self.meta.get("reasons") or {}
            why = "; ".join(f"{k}: {v}" for k, v in reasons.items()) or "the sampler recorded no samples"
            return {"available": False, "reason": f"power unavailable ({why})", "total_rail_method": rail.method}
        times = [float(s["t"]) for s in self.samples]
        whole = energy.window_energy(self.samples)
        runs_j = sum(w.get("total_energy_joules") or 0.0 for w in run_windows if w.get("available"))
        return {
            "available": True, "source": self.meta.get("source"), "total_rail": self.meta.get("total_rail"),
            "total_rail_method": rail.method, "total_rail_note": rail.note,
            "total_is_sum": bool(self.meta.get("total_is_sum")), "rails": self.meta.get("rails", []),
            "sampler_hz": self.meta.get("hz"),
            "sampling_rate_hz": round(energy.sampling_rate_hz(times) or 0.0, 3),
            "max_gap_s": round(max((b - a for a, b in itertools.pairwise(times)), default=0.0), 6),
            "samples": len(self.samples),
            "static_power_baseline_watts": round(self.baseline_w, 6) if self.baseline_w is not None else None,
            "idle_window": {"start": self.idle[0], "end": self.idle[1]} if self.idle else None,
            "total_energy_joules": round(runs_j, 6),  # over the measured run windows
            "session": {"start": round(whole.t0, 6), "end": round(whole.t1, 6),
                        "energy_joules": round(whole.energy_j, 6)},
            # One instant on both clocks, so windows can be lined up with wall-clock logs.
            "clock": {"monotonic": self.meta.get("start_t"), "wall": self.meta.get("start_wall")},
            "skipped_sources": self.meta.get("skipped", {}),
            "notes": self.notes,
        }

    def trace(self, step_s: float = 0.0) -> list[list[float]]:
        """[t, W] of the total for plotting (thinned to one point per ``step_s``)."""
        out: list[list[float]] = []
        for t, mw in energy.series(self.samples):
            if not out or t - out[-1][0] >= step_s:
                out.append([round(t, 3), round(mw / 1000.0, 4)])
        return out


class Sampler:
    """The agent's `sample` as a background job on the board."""

    def __init__(self, runner: Any, python: str, agent: str, work: str, hz: float, rail: TotalRail) -> None:
        self.path = f"{work}/power.jsonl"
        self.job = Job(runner, agent, f"{work}/jobs/sampler", "the power sampler")
        self.argv = [python, agent, "sample", "--out", self.path, "--hz", str(hz), "--total-rail", rail.sampler_arg]

    def start(self) -> None:
        self.job.launch(self.argv)

    def first_line(self, timeout: float = 15.0) -> dict[str, Any] | None:
        """The file's meta line once the sampler wrote it (it does so with its first sample)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            res = self.job.runner.run(["head", "-n", "1", self.path], check=False, timeout=30)
            if res.ok and res.stdout.strip():
                try:
                    return json.loads(res.stdout).get("meta")
                except ValueError:
                    pass
            if self.job.poll(0.3) != "running":
                res = self.job.runner.run(["head", "-n", "1", self.path], check=False, timeout=30)
                try:
                    return json.loads(res.stdout).get("meta") if res.ok else None
                except ValueError:
                    return None
        return None

    def stop(self) -> None:
        self.job.stop(grace_s=5.0)  # SIGTERM: the sampler writes its end line and exits
