"""Energy over an exact window from raw power samples: pure functions, no I/O but the loader.

Samples are (t, mW) with t on the board's monotonic clock. The energy over [t0, t1] is the
trapezoid rule over the samples inside the window plus the two edge points, whose power is
interpolated linearly between the samples that bracket t0 and t1. A window the samples don't cover
is an error (no extrapolation). The host imports this module too (edgekit.agent.energy).
"""

from __future__ import annotations

import bisect
import json
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable, Sequence

Point = Any  # (t, value) pairs; kept loose so 3.8 needs no runtime generics


class CoverageError(ValueError):
    """The window reaches outside the samples."""


def _value_at(ts: Sequence[float], points: Sequence[Point], t: float) -> float:
    i = bisect.bisect_right(ts, t)
    if i == 0:
        return float(points[0][1])  # t == first sample (coverage was checked)
    if i == len(ts):
        return float(points[-1][1])
    (ta, va), (tb, vb) = points[i - 1], points[i]
    if tb == ta:
        return float(vb)
    return va + (vb - va) * (t - ta) / (tb - ta)


def integrate(points: Sequence[Point], t0: float, t1: float) -> float:
    """∫ value dt over [t0, t1] (value × seconds), ``points`` sorted by time."""
    if t1 < t0:
        raise ValueError(f"window ends before it starts ({t0} > {t1})")
    if not points:
        raise CoverageError("no samples")
    ts = [float(p[0]) for p in points]
    if t0 < ts[0] or t1 > ts[-1]:
        raise CoverageError(f"window [{t0:.3f}, {t1:.3f}] is not covered by the samples [{ts[0]:.3f}, {ts[-1]:.3f}]")
    lo, hi = bisect.bisect_right(ts, t0), bisect.bisect_left(ts, t1)
    pts = [(t0, _value_at(ts, points, t0)), *points[lo:hi], (t1, _value_at(ts, points, t1))]
    total = 0.0
    for (ta, va), (tb, vb) in zip(pts, pts[1:]):
        total += (tb - ta) * (va + vb) / 2.0
    return total


def sampling_rate_hz(times: Sequence[float]) -> float | None:
    """Samples per second actually achieved: (n − 1) / span."""
    if len(times) < 2 or times[-1] <= times[0]:
        return None
    return (len(times) - 1) / (times[-1] - times[0])


def max_gap_s(times: Sequence[float], t0: float, t1: float) -> float | None:
    """The longest step between the samples that bracket and fill [t0, t1]."""
    lo = max(bisect.bisect_right(times, t0) - 1, 0)
    hi = min(bisect.bisect_left(times, t1) + 1, len(times))
    seg = times[lo:hi]
    return max((b - a for a, b in zip(seg, seg[1:])), default=None)


@dataclass
class Window:
    t0: float
    t1: float
    duration_s: float
    energy_j: float
    mean_power_w: float | None
    samples_in_window: int
    sampling_rate_hz: float | None
    max_gap_s: float | None
    rails_energy_j: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {k: round(v, 6) if isinstance(v, float) else v for k, v in asdict(self).items()}


def series(samples: Iterable[dict[str, Any]], rail: str | None = None) -> list[Point]:
    """(t, mW) of the total (``rail`` None) or of one rail; samples without that value left out."""
    out = []
    for s in samples:
        v = s.get("total_mw") if rail is None else (s.get("rails") or {}).get(rail)
        if v is not None:
            out.append((float(s["t"]), float(v)))
    out.sort(key=lambda p: p[0])
    return out


def window_energy(samples: Sequence[dict[str, Any]], t0: float | None = None, t1: float | None = None) -> Window:
    """Energy, mean power and sampling quality of the total rail over [t0, t1] (default: all)."""
    total = series(samples)
    if not total:
        raise CoverageError("no samples with a total power")
    t0 = total[0][0] if t0 is None else float(t0)
    t1 = total[-1][0] if t1 is None else float(t1)
    joules = integrate(total, t0, t1) / 1000.0  # mW·s → J
    times = [t for t, _ in total]
    inside = [t for t in times if t0 <= t <= t1]
    rails: dict[str, float] = {}
    labels = sorted({k for s in samples for k in (s.get("rails") or {})})
    for label in labels:
        try:
            rails[label] = round(integrate(series(samples, label), t0, t1) / 1000.0, 6)
        except CoverageError:
            continue  # a rail that dropped out at the edge: the total still stands
    dur = t1 - t0
    return Window(t0=t0, t1=t1, duration_s=dur, energy_j=joules, mean_power_w=joules / dur if dur > 0 else None,
                  samples_in_window=len(inside), sampling_rate_hz=sampling_rate_hz(inside),
                  max_gap_s=max_gap_s(times, t0, t1), rails_energy_j=rails)


def read_samples(path: str) -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, Any] | None]:
    """(meta, samples, end) from a sampler file; a torn last line (killed writer) is skipped."""
    meta: dict[str, Any] = {}
    end = None
    samples = []
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if not isinstance(rec, dict):
                continue
            if "meta" in rec:
                meta = rec["meta"]
            elif "end" in rec:
                end = rec["end"]
            elif "t" in rec:
                samples.append(rec)
    return meta, samples, end
