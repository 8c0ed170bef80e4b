"""Heat: which runs' windows the board throttled in, from the sampler's temperature-and-clock lines.

A window is throttled when, inside it, a thermal zone reached its passive trip point (where the kernel starts
to cap clocks) or a clock cap (a CPU's scaling_max_freq, the GPU's max_freq) fell below what it was when the
bench began (the power mode's ceiling). Such a run measured a slower board than the one named in the report:
it is flagged, and left out of the summary unless the user keeps it (``--keep-throttled``).
"""

from __future__ import annotations

import json
from typing import Any

CAP_DROP = 0.98  # a cap 2 % under its starting value is a drop (the kernel steps by whole OPPs)


def read_states(power_text: str) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """(throttle point per zone, the state lines) from the sampler's file."""
    trips: dict[str, float] = {}
    states = []
    for line in power_text.splitlines():
        if '"state"' not in line and '"meta"' not in line:
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            continue  # a torn last line
        if "meta" in rec:
            trips = rec["meta"].get("throttle_points_c") or {}
        elif "state" in rec:
            states.append(rec["state"])
    return trips, states


def check(t0: float, t1: float, trips: dict[str, float], states: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Why the window [t0, t1] was throttled, or None."""
    if not states:
        return None
    start_caps = states[0].get("caps_mhz") or {}
    inside = [s for s in states if t0 <= s["t"] <= t1]
    for s in inside:
        hot = {z: c for z, c in (s.get("temps_c") or {}).items() if z in trips and c >= trips[z]}
        if hot:
            zone = max(hot, key=lambda z: hot[z] - trips[z])
            return {"reason": f"{zone} at {hot[zone]:.1f} °C, past its throttle point {trips[zone]:.1f} °C",
                    "at": s["t"], "zone": zone, "temp_c": hot[zone], "trip_c": trips[zone]}
        low = {k: (v, start_caps[k]) for k, v in (s.get("caps_mhz") or {}).items()
               if start_caps.get(k) and v < CAP_DROP * start_caps[k]}
        if low:
            name = min(low, key=lambda k: low[k][0] / low[k][1])
            now, before = low[name]
            return {"reason": f"the {name} clock cap fell to {now:.0f} MHz from {before:.0f} MHz", "at": s["t"],
                    "clock": name, "cap_mhz": now, "cap_mhz_before": before}
    return None


def mark(run_docs: list[dict[str, Any]], power_text: str) -> tuple[int, dict[str, float]]:
    """Set ``runs[].throttled`` from the sampler's lines; how many were, and the zones' throttle points."""
    trips, states = read_states(power_text)
    n = 0
    for doc in run_docs:
        w = doc["window"]
        doc["throttled"] = check(float(w["start"]), float(w["end"]), trips, states)
        n += doc["throttled"] is not None
    return n, trips


def kept(run_docs: list[dict[str, Any]], keep_throttled: bool) -> tuple[list[dict[str, Any]], str | None]:
    """The runs the summary is made of, and a note when some were left out (or could not be)."""
    hot = [d for d in run_docs if d.get("throttled")]
    if not hot:
        return run_docs, None
    if keep_throttled:
        return run_docs, f"{len(hot)} of {len(run_docs)} runs throttled; kept in the summary (--keep-throttled)."
    cool = [d for d in run_docs if not d.get("throttled")]
    if not cool:
        return run_docs, f"every run throttled ({len(hot)}): kept, as nothing else was measured; let the board cool."
    return cool, (f"{len(hot)} of {len(run_docs)} runs throttled and were left out of the summary "
                  "(`runs[].throttled` says why; --keep-throttled keeps them).")
