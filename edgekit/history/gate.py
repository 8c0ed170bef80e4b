"""The regression gate: tonight's results against the recent nights of the same board and recipe.

Per series (tok/s, acceptance, J/token of each configuration and point):

    baseline  median of the nightly means of the last k nights (from the baseline start on)
    Δ         mean(current) / baseline − 1, signed so that "bad" is the metric's bad direction
    CI        seeded bootstrap CI of Δ at 99 % (edgekit/history/stats.py)
    verdict   regression   the CI lies entirely on the bad side of 0 AND |Δ| ≥ threshold / 2
              improvement  the same on the good side
              ok           otherwise: within noise, or real but smaller than threshold / 2
              new          no baseline night has this series yet

Why half the threshold: a true change of exactly `threshold` is measured as Δ ± noise, so a cut
at the threshold itself would catch only about half of them; the CI keeps noise from firing it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from edgekit.errors import EdgekitError
from edgekit.history.metrics import METRICS, MetricSamples, metrics_from_results, run_labels
from edgekit.history.stats import Comparison, compare, seed_for
from edgekit.history.store import History, Run, digest_of, timestamp

DEFAULT_THRESHOLD = 0.05
DEFAULT_K = 7
LEVEL = 0.99

_ALIASES = {spec.label.lower(): name for name, spec in METRICS.items()} | {
    "tps": "tokens_per_second", "tok/s": "tokens_per_second", "j/token": "joules_per_token", "jpt": "joules_per_token"}


def _fraction(text: str) -> float:
    t = text.strip()
    try:
        value = float(t[:-1]) / 100.0 if t.endswith("%") else float(t)
    except ValueError:
        raise EdgekitError(f"Threshold {text!r} is not a number or a percentage (e.g. 5%).") from None
    if not 0.0 < value < 1.0:
        raise EdgekitError(f"Threshold {text!r} must lie between 0 and 100 %.")
    return value


class GateFailed(EdgekitError):
    """The gate found a regression: exit 1 (2 stays for errors the user made)."""

    exit_code = 1


@dataclass(frozen=True)
class Thresholds:
    default: float = DEFAULT_THRESHOLD
    per_metric: dict[str, float] = field(default_factory=dict)

    def of(self, metric: str) -> float:
        return self.per_metric.get(metric, self.default)

    @classmethod
    def parse(cls, items: Iterable[str]) -> Thresholds:
        """"5%" sets the default; "joules_per_token=8%" (or "J/token=8%") one metric's."""
        default, per = DEFAULT_THRESHOLD, {}
        for item in items:
            if "=" in item:
                name, value = item.split("=", 1)
                metric = _ALIASES.get(name.strip().lower(), name.strip())
                if metric not in METRICS:
                    raise EdgekitError(f"Unknown metric {name!r} in a threshold; known: {', '.join(METRICS)}.")
                per[metric] = _fraction(value)
            else:
                default = _fraction(item)
        return cls(default, per)


@dataclass(frozen=True)
class Verdict:
    samples: MetricSamples
    threshold: float
    verdict: str  # regression | improvement | ok | new
    reason: str
    comparison: Comparison | None = None

    def line(self) -> str:
        s, c = self.samples, self.comparison
        head = f"{s.label}:"
        shown = self.verdict.upper() if self.verdict == "regression" else self.verdict
        if c is None:
            return f"{head} current {_fmt(_mean(s.values), s.unit)} (n={len(s.values)}); {self.reason} → {self.verdict}"
        return (f"{head} baseline {_fmt(c.baseline, s.unit)} (median of {c.nights} night"
                f"{'s' if c.nights != 1 else ''}, {c.n_baseline} reps), current {_fmt(c.current, s.unit)} "
                f"(n={c.n_current}), change {c.delta:+.1%} ({c.level:.0%} CI {c.ci_low:+.1%} … {c.ci_high:+.1%}), "
                f"threshold {_pct(self.threshold)} → {shown} ({self.reason})")

    def to_json(self) -> dict[str, Any]:
        s = self.samples
        return {"series": s.series, "metric": s.metric, "config": s.config, "point": s.point, "unit": s.unit,
                "direction": s.direction, "threshold": self.threshold, "verdict": self.verdict,
                "reason": self.reason, "comparison": self.comparison.to_json() if self.comparison else None,
                "current_values": list(s.values), "line": self.line()}


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


def _pct(fraction: float) -> str:
    return f"{fraction * 100:.3g}%"


def _fmt(value: float, unit: str) -> str:
    if unit == "fraction":
        return f"{value:.1%}"
    digits = 2 if abs(value) >= 10 else 4 if abs(value) >= 0.01 else 6
    return f"{value:.{digits}f} {unit}"


def judge(samples: MetricSamples, nights: Sequence[Sequence[float]], threshold: float, *, level: float = LEVEL,
          seed: int = 0, resamples: int = 4000) -> Verdict:
    """The verdict on one series, given the baseline nights' repetitions."""
    nights = [n for n in nights if len(n)]
    if not nights:
        return Verdict(samples, threshold, "new", "no baseline night has this series yet")
    try:
        c = compare(nights, samples.values, level=level, resamples=resamples,
                    seed=seed_for(f"{samples.board}/{samples.recipe}/{samples.series}", seed))
    except ValueError as exc:
        return Verdict(samples, threshold, "ok", f"not comparable: {exc}")
    # The CI entirely on one side of 0; which side is bad depends on the metric.
    below, above = c.ci_high < 0, c.ci_low > 0
    worse, better = (below, above) if samples.direction == "bigger" else (above, below)
    big = abs(c.delta) >= threshold / 2
    if worse and big:
        return Verdict(samples, threshold, "regression", "worse beyond noise", c)
    if better and big:
        return Verdict(samples, threshold, "improvement", "better beyond noise", c)
    if worse or better:
        return Verdict(samples, threshold, "ok", f"real but under {_pct(threshold / 2)}", c)
    return Verdict(samples, threshold, "ok", "within noise", c)


@dataclass
class GateReport:
    board: str
    recipe: str
    current: dict[str, Any]
    window: list[Run]
    verdicts: list[Verdict]
    k: int
    baseline_updated: bool = False
    notes: list[str] = field(default_factory=list)

    @property
    def regressions(self) -> list[Verdict]:
        return [v for v in self.verdicts if v.verdict == "regression"]

    @property
    def improvements(self) -> list[Verdict]:
        return [v for v in self.verdicts if v.verdict == "improvement"]

    @property
    def failed(self) -> bool:
        return bool(self.regressions) and not self.baseline_updated

    @property
    def headline(self) -> str:
        where = f"{self.board} / {self.recipe}"
        if self.baseline_updated:
            return f"{where}: baseline reset to this run ({len(self.regressions)} regression(s), " \
                   f"{len(self.improvements)} improvement(s) accepted)."
        if not self.window:
            return f"{where}: no baseline nights yet; nothing to compare (pass)."
        if self.regressions:
            n = len(self.regressions)
            return f"{where}: {n} regression(s) against the last {len(self.window)} night(s) (fail)."
        extra = f", {len(self.improvements)} improvement(s)" if self.improvements else ""
        return f"{where}: no regression against the last {len(self.window)} night(s){extra} (pass)."

    def lines(self) -> list[str]:
        return [self.headline, *self.notes, *(v.line() for v in self.verdicts)]

    def to_json(self) -> dict[str, Any]:
        return {"board": self.board, "recipe": self.recipe, "passed": not self.failed, "headline": self.headline,
                "k": self.k, "baseline_updated": self.baseline_updated, "notes": self.notes,
                "current": self.current,
                "window": [{"run_id": r.id, "created": r.created, "release": r.release, "llama_ref": r.llama_ref}
                           for r in self.window],
                "verdicts": [v.to_json() for v in self.verdicts]}

    def markdown(self) -> str:
        icon = {"regression": "❌ regression", "improvement": "✅ improvement", "ok": "ok", "new": "new"}
        out = [f"### Gate: {self.headline}", ""]
        out += [f"> {n}" for n in self.notes] + ([""] if self.notes else [])
        out += ["| series | baseline | current | change | 99% CI | threshold | verdict |",
                "| --- | ---: | ---: | ---: | --- | ---: | --- |"]
        for v in self.verdicts:
            s, c = v.samples, v.comparison
            if c is None:
                out.append(f"| {s.label} | – | {_fmt(_mean(s.values), s.unit)} | – | – | {_pct(v.threshold)} | "
                           f"{icon[v.verdict]} |")
                continue
            out.append(f"| {s.label} | {_fmt(c.baseline, s.unit)} | {_fmt(c.current, s.unit)} | {c.delta:+.1%} | "
                       f"{c.ci_low:+.1%} … {c.ci_high:+.1%} | {_pct(v.threshold)} | {icon[v.verdict]} ({v.reason}) |")
        return "\n".join(out) + "\n"


def run_gate(history: History, doc: dict[str, Any], *, k: int = DEFAULT_K, thresholds: Thresholds | None = None,
             level: float = LEVEL, seed: int = 0, update_baseline: bool = False,
             metrics: Iterable[str] | None = None) -> GateReport:
    """Judge every series of ``doc`` against the history; with update_baseline, start the window here."""
    thresholds = thresholds or Thresholds()
    labels = run_labels(doc)
    samples = metrics_from_results(doc)
    if metrics:
        wanted = {_ALIASES.get(m.lower(), m) for m in metrics}
        unknown = wanted - set(METRICS)
        if unknown:
            raise EdgekitError(f"Unknown metric {', '.join(sorted(unknown))}; known: {', '.join(METRICS)}.")
        samples = [s for s in samples if s.metric in wanted]
    digest = digest_of(doc)
    until = timestamp(labels["created"])
    # A night at another nvpmodel mode measures another machine (clocks, cores, power cap): not a baseline.
    window = history.window(labels["board"], labels["recipe"], k, until_ts=until, exclude_digest=digest,
                            power_mode=labels["power_mode"])
    recent = history.window(labels["board"], labels["recipe"], k, until_ts=until, exclude_digest=digest)
    other = {r.id for r in recent} - {r.id for r in window}  # recent nights at another mode
    values = history.values([r.id for r in window])
    verdicts = [judge(s, [values.get(s.series, {}).get(r.id, []) for r in window], thresholds.of(s.metric),
                      level=level, seed=seed) for s in samples]
    current = {key: labels[key] for key in ("created", "release", "llama_ref")}
    report = GateReport(labels["board"], labels["recipe"], current, window, verdicts, k)
    if other:
        report.notes.append(f"Compared only with nights at power mode {labels['power_mode'] or '(none)'}: "
                            f"{len(other)} of the {len(recent)} most recent nights ran at another mode.")
    start = history.baseline_start(labels["board"], labels["recipe"])
    if start is not None:
        report.notes.append(f"Baseline window starts at run {start.id} ({start.when} UTC, release {start.release}).")
    if update_baseline:
        added = history.add(doc, source="gate --update-baseline")
        history.set_baseline(added.run)
        report.baseline_updated = True
        report.notes.append(f"Baseline reset: from now on the window starts at this run (id {added.run.id}); "
                            "earlier nights no longer count.")
    return report
