"""The regression gate: its error rates on synthetic histories, its verdicts, thresholds and CLI.

Synthetic histories (seeded, deterministic): 7 nights × 10 repetitions of baseline and 10
repetitions tonight, Gaussian noise with CV 1 %, 2 % and 3 % (a Jetson on fixed nvpmodel +
jetson_clocks is in that range; 10 repetitions is what a nightly budget affords for one point).
Trials with a true 5 % regression — half tok/s (bigger is better) 5 % lower, half J/token
(smaller is better) 5 % higher — must be caught ≥ 95 % of the time, and trials without a change
may raise ≤ 1 % false alarms. At CV 1–2 % the ½-threshold floor decides and 200 + 200 trials show
100 % / 0 %; CV 3 % is the edge of what 10 repetitions resolve (the CI decides there: ~96 %
detection, ~0.5 % false alarms), so it gets 600 + 600 trials to keep the measured rates close to
the true ones. Each trial is one series judged by `judge`, the function the CLI uses, with its
defaults: 99 % CI, 4000 resamples, threshold 5 %.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from test_history import make_doc, night

from edgekit.cli import cli
from edgekit.errors import EdgekitError
from edgekit.history.gate import Thresholds, judge, run_gate
from edgekit.history.metrics import MetricSamples
from edgekit.history.stats import compare
from edgekit.history.store import History

NIGHTS, BASE_REPS, CUR_REPS = 7, 10, 10


def _samples(metric: str, values: np.ndarray) -> MetricSamples:
    direction = "bigger" if metric == "tokens_per_second" else "smaller"
    return MetricSamples(metric=metric, direction=direction, unit="x", values=tuple(values), board="b", recipe="r",
                         config="drafter", concurrency=1, context_length=128)


def _trial(rng: np.random.Generator, cv: float, change: float, metric: str) -> str:
    level = 40.0 if metric == "tokens_per_second" else 0.5
    nights = [level * (1 + rng.normal(0, cv, BASE_REPS)) for _ in range(NIGHTS)]
    current = level * (1 + change) * (1 + rng.normal(0, cv, CUR_REPS))
    return judge(_samples(metric, current), nights, 0.05).verdict


def _rates(cv: float, trials: int, null_trials: int) -> tuple[float, float]:
    rng = np.random.default_rng(int(cv * 1000))
    metrics = ["tokens_per_second", "joules_per_token"]
    caught = sum(_trial(rng, cv, -0.05 if i % 2 == 0 else 0.05, metrics[i % 2]) == "regression"
                 for i in range(trials))
    alarms = sum(_trial(rng, cv, 0.0, metrics[i % 2]) == "regression" for i in range(null_trials))
    return caught / trials, alarms / null_trials


@pytest.mark.parametrize(("cv", "trials", "null_trials"), [(0.01, 200, 200), (0.02, 200, 200), (0.03, 600, 600)])
def test_gate_catches_5pct_regressions_with_few_false_alarms(cv: float, trials: int, null_trials: int) -> None:
    detection, false_alarms = _rates(cv, trials, null_trials)
    print(f"CV {cv:.0%}: detection {detection:.1%}, false alarms {false_alarms:.2%}")
    assert detection >= 0.95
    assert false_alarms <= 0.01


def test_compare_is_deterministic_and_centred() -> None:
    rng = np.random.default_rng(5)
    nights = [40 * (1 + rng.normal(0, 0.02, 10)) for _ in range(7)]
    cur = 40 * 0.9 * (1 + rng.normal(0, 0.02, 10))
    a, b = compare(nights, cur, seed=3), compare(nights, cur, seed=3)
    assert a == b
    assert a.baseline == pytest.approx(float(np.median([n.mean() for n in nights])))
    assert a.ci_low < a.delta < a.ci_high < 0 and a.delta == pytest.approx(-0.1, abs=0.02)
    assert a.noise_cv == pytest.approx(0.02, rel=0.3)


def test_night_to_night_drift_widens_the_interval() -> None:
    rng = np.random.default_rng(9)
    quiet = [40 * (1 + rng.normal(0, 0.01, 10)) for _ in range(7)]
    drifty = [n * f for n, f in zip(quiet, [0.96, 1.04, 0.98, 1.03, 1.0, 0.97, 1.02], strict=True)]
    cur = 40 * (1 + rng.normal(0, 0.01, 10))
    a, b = compare(quiet, cur), compare(drifty, cur)
    assert a.drift < 0.005 < 0.02 < b.drift
    assert (b.ci_high - b.ci_low) > 2 * (a.ci_high - a.ci_low)


def test_small_runs_borrow_the_baselines_noise() -> None:
    nights = [[40.0, 41.0, 39.0, 40.5, 39.5]] * 5
    c = compare(nights, [36.0])  # one repetition tonight: its noise comes from the pooled baseline
    assert c.ci_low < c.delta < c.ci_high < 0


@pytest.mark.parametrize(("values", "expected"), [
    ([40.0] * 3, "ok"), ([36.0, 36.2, 35.8], "regression"), ([44.0, 44.2, 43.8], "improvement"),
    ([39.0, 39.1, 38.9], "ok"),  # −2.5 % is real here (tiny noise) but under half the threshold
])
def test_verdicts_for_bigger_is_better(values: list[float], expected: str) -> None:
    nights = [[40.0, 40.1, 39.9]] * 7
    v = judge(_samples("tokens_per_second", np.array(values)), nights, 0.06)
    assert v.verdict == expected, v.line()


def test_verdicts_for_smaller_is_better_and_new_series() -> None:
    nights = [[0.50, 0.501, 0.499]] * 7
    assert judge(_samples("joules_per_token", np.array([0.55, 0.551, 0.549])), nights, 0.05).verdict == "regression"
    assert judge(_samples("joules_per_token", np.array([0.45, 0.451, 0.449])), nights, 0.05).verdict == "improvement"
    v = judge(_samples("joules_per_token", np.array([0.5])), [], 0.05)
    assert v.verdict == "new" and "no baseline" in v.line()


def test_thresholds_parse_default_and_per_metric() -> None:
    th = Thresholds.parse(["4%", "J/token=8%", "acceptance=0.1"])
    assert (th.of("tokens_per_second"), th.of("joules_per_token"), th.of("acceptance")) == (0.04, 0.08, 0.1)
    assert Thresholds.parse([]).of("tokens_per_second") == 0.05
    for bad in (["fast"], ["150%"], ["watts=5%"]):
        with pytest.raises(EdgekitError):
            Thresholds.parse(bad)


# ----------------------------------------------------------------------------------- gate on documents


def _history(db: Path, days: int = 7) -> None:
    with History(db) as h:
        for day in range(1, days + 1):
            h.add(night(day))


def test_run_gate_explains_every_series_and_fails_on_a_slower_night(tmp_path: Path) -> None:
    db = tmp_path / "h.sqlite"
    _history(db)
    with History(db) as h:
        ok = run_gate(h, night(8))
        slow = run_gate(h, night(8, tps=36.0))  # 10 % slower; J/token 11 % higher
    assert not ok.failed and len(ok.window) == 7 and {v.verdict for v in ok.verdicts} == {"ok"}
    assert slow.failed
    verdicts = {v.samples.series: v.verdict for v in slow.verdicts}
    assert verdicts["drafter/c1 ctx128/tokens_per_second"] == "regression"
    assert verdicts["baseline/c1 ctx128/joules_per_token"] == "regression"
    assert verdicts["drafter/c1 ctx128/acceptance"] == "ok"
    line = next(v.line() for v in slow.verdicts if v.samples.series == "drafter/c1 ctx128/tokens_per_second")
    for part in ("baseline 40.00 tok/s", "median of 7 nights", "current 36.00 tok/s", "change -10.0%",
                 "99% CI", "threshold 5%", "REGRESSION"):
        assert part in line, line
    assert "| tok/s drafter c1 ctx128 |" in slow.markdown() and "❌ regression" in slow.markdown()


def test_update_baseline_accepts_the_new_level(tmp_path: Path) -> None:
    db = tmp_path / "h.sqlite"
    _history(db)
    with History(db) as h:
        accepted = run_gate(h, night(8, tps=36.0), update_baseline=True)
        assert accepted.regressions and not accepted.failed and accepted.baseline_updated
        after = run_gate(h, night(9, tps=36.0))
    assert not after.failed and len(after.window) == 1  # only the accepted night counts now


def test_improvements_are_reported_and_pass(tmp_path: Path) -> None:
    db = tmp_path / "h.sqlite"
    _history(db)
    with History(db) as h:
        report = run_gate(h, night(8, tps=44.0))
    assert not report.failed and report.improvements and "improvement" in report.headline


def test_first_night_has_no_baseline_and_passes(tmp_path: Path) -> None:
    with History(tmp_path / "h.sqlite") as h:
        report = run_gate(h, night(1))
    assert not report.failed and {v.verdict for v in report.verdicts} == {"new"}
    assert "no baseline" in report.headline


def test_other_boards_and_recipes_are_not_a_baseline(tmp_path: Path) -> None:
    db = tmp_path / "h.sqlite"
    with History(db) as h:
        for day in range(1, 8):
            h.add(night(day, tps=50.0, board="thor-1"))
            h.add(night(day, tps=50.0, recipe="e4b-mtp"))
        report = run_gate(h, night(8, tps=40.0))
    assert not report.window and not report.failed


def at_mode(doc: dict, name: str) -> dict:
    doc["board"]["nvpmodel"] = {"id": {"MAXN": 0, "15W": 2}[name], "name": name}
    return doc


def test_a_night_is_compared_only_with_nights_at_its_power_mode(tmp_path: Path) -> None:
    # Seven nights at MAXN, then three at 15 W (slower, as a lower mode is): the 15 W night is no regression
    # against MAXN, and a MAXN night is judged against MAXN alone.
    db = tmp_path / "h.sqlite"
    with History(db) as h:
        for day in range(1, 8):
            h.add(at_mode(night(day), "MAXN"))
        for day in range(8, 11):
            h.add(at_mode(night(day, tps=24.0), "15W"))
        low = run_gate(h, at_mode(night(11, tps=24.0), "15W"))
        maxn = run_gate(h, at_mode(night(11, tps=36.0), "MAXN"))
    assert len(low.window) == 3 and not low.failed, low.lines()
    assert any("power mode 15W" in n for n in low.notes)
    assert len(maxn.window) == 7 and maxn.failed  # 10 % below the MAXN nights: a regression
    assert any("power mode MAXN" in n for n in maxn.notes)


def test_gate_cli_exit_codes_markdown_and_json(tmp_path: Path) -> None:
    db = tmp_path / "h.sqlite"
    _history(db)
    same, slow = tmp_path / "same.json", tmp_path / "slow.json"
    same.write_text(json.dumps(night(8)))
    slow.write_text(json.dumps(night(8, tps=36.0)))
    summary = tmp_path / "summary.md"
    runner = CliRunner()
    res = runner.invoke(cli, ["gate", "--history", str(db), "--current", str(same), "--markdown", str(summary)])
    assert res.exit_code == 0, res.output
    assert "no regression against the last 7 night(s)" in res.output
    res = runner.invoke(cli, ["gate", "--history", str(db), "--current", str(slow), "--threshold", "5%",
                              "--k", "7", "--markdown", str(summary)])
    assert res.exit_code == 1 and isinstance(res.exception, EdgekitError)
    assert "REGRESSION" in res.output and "change -10.0%" in res.output
    assert summary.read_text().count("### Gate:") == 2
    res = runner.invoke(cli, ["--json", "gate", "--history", str(db), "--current", str(slow), "--metric", "acceptance"])
    assert res.exit_code == 0  # acceptance alone did not regress
    doc = json.loads(res.output)
    assert doc["passed"] and {v["metric"] for v in doc["verdicts"]} == {"acceptance"}
    # A wide threshold: the 10 % drop is real but under half of 30 %.
    res = runner.invoke(cli, ["gate", "--history", str(db), "--current", str(slow), "--threshold", "30%"])
    assert res.exit_code == 0 and "real but under 15%" in res.output


def test_make_doc_with_many_points() -> None:
    doc = make_doc({("drafter", c, 128): {"tokens_per_second": [10.0 * c, 10.1 * c]} for c in (1, 2, 4)})
    assert len(doc["runs"]) == 6 and len(doc["summary"]["points"]) == 3


def test_zero_baselines_are_not_comparable_and_raise_no_warnings() -> None:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no division-by-zero RuntimeWarning from numpy
        v = judge(_samples("tokens_per_second", np.array([0.0, 0.0, 0.0])), [[0.0, 0.0, 0.0]] * 3, 0.05)
        assert v.verdict == "ok" and "not comparable" in v.reason
        v = judge(_samples("tokens_per_second", np.array([0.0, 0.0])), [[1.0, 1.1], [0.0, 0.0], [1.0, 0.9]], 0.05)
        assert v.verdict == "regression"


def test_unknown_metric_selection_is_a_user_error(tmp_path: Path) -> None:
    with History(tmp_path / "h.sqlite") as h, pytest.raises(EdgekitError, match="Unknown metric"):
        run_gate(h, night(1), metrics=["watts"])
