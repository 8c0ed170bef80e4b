"""Small-sample statistics for benchmark repetitions: mean, CI95 (Student's t), percentiles.

Benchmarks repeat a handful of times, so the 95 % interval uses Student's t with n − 1 degrees
of freedom, not the normal 1.96 (which would claim too much for n = 3).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

# Two-sided 95 % critical values of Student's t, by degrees of freedom.
_T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
        11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120, 17: 2.110, 18: 2.101, 19: 2.093,
        20: 2.086, 25: 2.060, 30: 2.042, 40: 2.021, 60: 2.000, 120: 1.980}


def t95(df: int) -> float:
    if df < 1:
        raise ValueError("a confidence interval needs at least two values")
    if df in _T95:
        return _T95[df]
    below = max(k for k in _T95 if k < df) if df < 120 else 120
    return _T95[below] if df < 120 else 1.960  # the next smaller df: slightly conservative


@dataclass(frozen=True)
class Estimate:
    """Mean of repetitions with its 95 % interval (None when n < 2)."""

    mean: float
    ci95: float | None  # half-width
    n: int
    stdev: float | None
    values: tuple[float, ...]

    @property
    def low(self) -> float | None:
        return None if self.ci95 is None else self.mean - self.ci95

    @property
    def high(self) -> float | None:
        return None if self.ci95 is None else self.mean + self.ci95

    def to_json(self, digits: int = 6) -> dict[str, object]:
        data = asdict(self)
        data["values"] = [round(v, digits) for v in self.values]
        for key in ("mean", "ci95", "stdev"):
            if data[key] is not None:
                data[key] = round(data[key], digits)
        return data

    def overlaps(self, other: Estimate) -> bool:
        """Do the two 95 % intervals overlap (a tie we can't separate)?"""
        if self.low is None or other.low is None:
            return True
        return not (self.high < other.low or other.high < self.low)  # type: ignore[operator]


def estimate(values: Sequence[float]) -> Estimate | None:
    vals = tuple(float(v) for v in values if v is not None and math.isfinite(v))
    if not vals:
        return None
    n = len(vals)
    mean = sum(vals) / n
    if n < 2:
        return Estimate(mean, None, n, None, vals)
    sd = math.sqrt(sum((v - mean) ** 2 for v in vals) / (n - 1))
    return Estimate(mean, t95(n - 1) * sd / math.sqrt(n), n, sd, vals)


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear-interpolation percentile (numpy's default), q in [0, 100]."""
    vals = sorted(v for v in values if v is not None)
    if not vals:
        return None
    pos = (len(vals) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(vals) - 1)
    return vals[lo] + (vals[hi] - vals[lo]) * (pos - lo)


def ratio(num: float | None, den: float | None) -> float | None:
    if num is None or not den:
        return None
    return num / den
