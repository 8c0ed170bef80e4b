"""Is tonight different from the recent nights? A bootstrap CI of the relative change of the mean.

Baseline: k nights, each a handful of repetitions. Its centre is the median of the nightly means
(one odd night doesn't move it). The change is Δ = mean(current) / centre − 1.

The CI of Δ comes from resampling, all of it vectorized over the replicates:

* baseline: every night's repetitions are redrawn from the baseline's *pooled* relative residuals
  (x / night mean − 1): a fixed-clock board's noise is one property of the board, and 70 residuals
  describe it better than 10; then the centre is the median of the redrawn nightly means;
* current: its own relative residuals when it has ≥ 3 repetitions (a noisier night must show;
  pooling them with the baseline's bought no power in simulation), else the baseline's pool;
* drift: when the nightly means scatter significantly more than their repetitions explain
  (χ² test at 5 %), that extra night-to-night spread τ (method of moments) is a noise of its own
  that a single night can't show, so each replicate adds a N(0, τ²) night offset to the current
  mean (and the median's share, τ²·π/2k, to the centre).

Residuals are scaled by √(n/(n−1)) so the resampled variance is the unbiased one (plain bootstrap
under-states it by (n−1)/n, which matters at n = 10).
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

MIN_OWN_RESIDUALS = 3  # below this the current run borrows the baseline's noise


@dataclass(frozen=True)
class Comparison:
    baseline: float  # median of the nightly means
    current: float  # mean of the current repetitions
    delta: float  # current / baseline − 1
    ci_low: float  # CI of delta at `level`
    ci_high: float
    level: float
    nights: int
    n_baseline: int  # repetitions pooled over the nights
    n_current: int
    noise_cv: float  # pooled repetition-to-repetition CV of the baseline
    drift: float  # night-to-night CV beyond what the repetitions explain

    def to_json(self, digits: int = 6) -> dict[str, float | int]:
        return {k: (round(v, digits) if isinstance(v, float) else v) for k, v in self.__dict__.items()}


def seed_for(key: str, seed: int = 0) -> int:
    """A stable seed per series: the same inputs give the same CI on every machine."""
    return (zlib.crc32(key.encode()) + 7919 * seed) & 0xFFFFFFFF


def _residuals(x: np.ndarray) -> np.ndarray:
    """Relative residuals of one night, scaled to the unbiased variance (empty when n < 2)."""
    n = x.size
    if n < 2:
        return np.empty(0)
    mean = x.mean()
    if mean == 0.0:
        return np.zeros(n)  # no relative spread around zero (e.g. a drafter that never hits)
    return (x / mean - 1.0) * math.sqrt(n / (n - 1))


def _redraw_means(pool: np.ndarray, counts: np.ndarray, rng: np.random.Generator, b: int) -> np.ndarray:
    """(b, len(counts)) relative offsets: the mean of counts[i] residuals drawn from pool, per replicate."""
    if pool.size == 0:
        return np.zeros((b, counts.size))
    width = int(counts.max())
    draws = pool[rng.integers(0, pool.size, size=(b, counts.size, width), dtype=np.int32)]
    if (counts == width).all():
        return draws.mean(axis=2)
    mask = np.arange(width)[None, None, :] < counts[None, :, None]  # nights with fewer repetitions
    return (draws * mask).sum(axis=2) / counts[None, :]


def _chi2_95(df: int) -> float:
    """95th percentile of χ²(df), Wilson–Hilferty (within 1 % for df ≥ 2; no scipy needed)."""
    z = 1.6448536
    return df * (1.0 - 2.0 / (9 * df) + z * math.sqrt(2.0 / (9 * df))) ** 3


def _row_median(x: np.ndarray) -> np.ndarray:
    """Median of each row; np.sort + pick is several times faster than np.median for short rows."""
    s = np.sort(x, axis=1)
    k = s.shape[1]
    return s[:, k // 2] if k % 2 else 0.5 * (s[:, k // 2 - 1] + s[:, k // 2])


def compare(nights: Sequence[Sequence[float]], current: Sequence[float], *, level: float = 0.99,
            resamples: int = 4000, seed: int = 0) -> Comparison:
    """Relative change of ``current`` against the baseline ``nights`` with its bootstrap CI."""
    night_arrays = [np.asarray(n, dtype=float) for n in nights if len(n)]
    cur = np.asarray(current, dtype=float)
    if not night_arrays or cur.size == 0:
        raise ValueError("compare needs at least one baseline night and one current value")
    means = np.array([a.mean() for a in night_arrays])
    counts = np.array([a.size for a in night_arrays])
    centre = float(np.median(means))
    cur_mean = float(cur.mean())
    if centre == 0.0:
        raise ValueError("the baseline is zero: a relative change is undefined")

    pool = np.concatenate([_residuals(a) for a in night_arrays])
    own = _residuals(cur)
    noise_var = float(pool.var()) if pool.size else float(own.var()) if own.size else 0.0
    cur_pool = own if cur.size >= MIN_OWN_RESIDUALS else pool  # a noisier night must show

    # Night-to-night variance beyond the repetitions' own (needs ≥ 3 nights to say anything). Only
    # counted when the nightly means scatter significantly more than their repetitions explain: with
    # none, a moment estimate is still positive half the time and would only widen the CI.
    k = means.size
    tau2 = 0.0
    if k >= 3:
        expected = noise_var * float(np.mean(1.0 / counts))  # variance of a nightly mean from noise alone
        observed = float((means / centre - 1.0).var(ddof=1))
        if observed > expected * _chi2_95(k - 1) / (k - 1):
            tau2 = observed - expected

    rng = np.random.default_rng(seed)
    base_star = _row_median(means[None, :] * (1.0 + _redraw_means(pool, counts, rng, resamples)))
    cur_star = cur_mean * (1.0 + _redraw_means(cur_pool, np.array([cur.size]), rng, resamples)[:, 0])
    if tau2 > 0.0:
        tau = math.sqrt(tau2)
        cur_star = cur_star * (1.0 + rng.normal(0.0, tau, resamples))
        base_star = base_star * (1.0 + rng.normal(0.0, tau * math.sqrt(math.pi / (2 * k)), resamples))
    delta_star = cur_star / base_star - 1.0
    alpha = (1.0 - level) / 2.0
    low, high = np.quantile(delta_star, [alpha, 1.0 - alpha])
    return Comparison(baseline=centre, current=cur_mean, delta=cur_mean / centre - 1.0, ci_low=float(low),
                      ci_high=float(high), level=level, nights=k, n_baseline=int(counts.sum()),
                      n_current=int(cur.size), noise_cv=math.sqrt(noise_var), drift=math.sqrt(tau2))
