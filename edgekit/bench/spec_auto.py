"""`runtime.spec: auto`: the board serves the drafter only where it shows that it wins.

    deploy as the recipe says (with its drafter) → health → an A/B on the board: the release's server with
    and without its drafter, alternating (A B A B …) on the same prompts at the recipe's concurrency
    (``runtime.parallel``) and its clients' temperature (``runtime.client_temperature``; greedy when unset: a
    sampled request accepts fewer drafts, so a gain measured greedy can be a loss for them) → the drafter's gain
    per pair (tok/s, or tokens per joule for ``bench.objective: energy``) with its CI95 → above
    ``runtime.spec_min_gain``: kept; otherwise the recipe's target alone is deployed, and its release.json says
    why, with the figures (``runtime.spec_decision``).

On small targets the gain depends on the card, the model, the task and the load, so only the board can say:
in a published user report (llama.cpp, github.com/xbill9/gemma4-dev) Gemma 4 E2B's drafter gave 1.40× on an
RTX 3050 and 1.18× on a GTX 1650 Ti one request at a time, and a loss on the 1650 Ti from 8 concurrent
requests. A redeploy of the same recipe measures nothing again (``remeasure`` does): the board already serves
either the drafted release, which won, or the target alone decided from it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rich.console import Console

from edgekit.bench import engines, prompts
from edgekit.bench.power import window_power
from edgekit.bench.session import Run, Session, SessionOptions, check_restored
from edgekit.bench.stats import Estimate, estimate
from edgekit.bench.workloads import Point, requests_per_run
from edgekit.config.boardfile import Board
from edgekit.config.recipes import Recipe
from edgekit.deploy.pipeline import DeployOptions, DeployReport, PushOutcome, deploy, push
from edgekit.errors import EdgekitError
from edgekit.remote import releases
from edgekit.remote.probe import probe
from edgekit.remote.runner import runner_for

FIRST_PAIRS = 3  # pairs before the first look at the interval
MAX_PAIRS = 8  # then one pair at a time until the CI95 clears the bar or this many


@dataclass
class Verdict:
    serve: str  # "drafter" | "target alone"
    reason: str
    figures: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return {"serve": self.serve, "reason": self.reason, **self.figures}


def _gains(runs: list[Run], objective: str) -> Estimate | None:
    """The drafter's gain per pair of runs (same repetition, same prompts): tok/s over the target alone's, or
    the target alone's J/token over the drafter's (> 1: the drafter wins either way)."""
    by_rep: dict[int, dict[str, Run]] = {}
    for r in runs:
        by_rep.setdefault(r.repetition, {})[r.config] = r
    out = []
    for pair in by_rep.values():
        d, b = pair.get("drafter"), pair.get("baseline")
        if d is None or b is None:
            continue
        if objective == "speed":
            dv, bv = d.metrics.get("tokens_per_second"), b.metrics.get("tokens_per_second")
            if dv and bv:
                out.append(dv / bv)
        else:
            dj = (d.power or {}).get("joules_per_token")
            bj = (b.power or {}).get("joules_per_token")
            if dj and bj:
                out.append(bj / dj)
    return estimate(out)


def judge(gain: Estimate | None, min_gain: float, final: bool) -> str | None:
    """"drafter", "target alone", or None (not yet clear: more pairs)."""
    if gain is None or gain.low is None or gain.high is None:
        return "target alone" if final else None
    if gain.low > min_gain:
        return "drafter"
    if gain.high < min_gain or final:
        return "target alone"
    return None


def _mean(runs: list[Run], config: str, key: str, power: bool = False) -> dict[str, Any] | None:
    vals = [((r.power or {}).get(key) if power else r.metrics.get(key)) for r in runs if r.config == config]
    e = estimate([v for v in vals if v])
    return e.to_json(4) if e else None


def _reason(serve: str, gain: Estimate | None, objective: str, min_gain: float, concurrency: int,
            temperature: float = 0.0) -> str:
    what = "tok/s" if objective == "speed" else "tokens per joule"
    if gain is None:
        return f"the target alone is served: the A/B gave no {what} to compare"
    ci = f" (CI95 {gain.low:.2f}–{gain.high:.2f}, {gain.n} pairs" if gain.low is not None else f" ({gain.n} pair"
    ci += f", concurrency {concurrency}" + (f", temperature {temperature:g})" if temperature else ")")
    if serve == "drafter":
        return f"the drafter is served: {gain.mean:.2f}× the target alone's {what}{ci}"
    if gain.high is not None and gain.high < min_gain:
        return f"the target alone is served: with the drafter, {gain.mean:.2f}× its {what}{ci}"
    return (f"the target alone is served: the drafter's {gain.mean:.2f}× {what}{ci} does not show a gain "
            f"above {min_gain:g}×")


def measure(name: str, board: Board, recipe: Recipe, lock_wait_s: int, say: Callable[[str], None]) -> Verdict:
    """The A/B on the board's deployed release (the service is stopped meanwhile and started again after)."""
    b, rt = recipe.bench, recipe.runtime
    objective, concurrency, ctx, n_gen = b.objective, rt.parallel, min(b.context_lengths), b.n_gen
    temperature = rt.client_temperature or 0.0  # where the recipe's clients sample: fewer drafts accepted there
    n_cat = len(prompts.categories(prompts.load(b.prompt_set)))
    sopts = SessionOptions(power=objective == "energy", cooldown_temp_c=b.cooldown_temp_c, lock_wait_s=lock_wait_s)
    start = time.monotonic()
    sess = Session(name, board, recipe, sopts, say=say)
    runs: list[Run] = []
    verdict: str | None = None
    with sess:
        rel = sess.release_for(sess.engine)
        pair = engines.configs(rel, board, sess.bench_port, concurrency, ctx + n_gen + 256)
        drafter = next((c for c in pair if c.speculative), None)
        if drafter is None:
            raise EdgekitError(f"Release {rel.id} on board {name!r} does not draft: nothing to decide.")
        baseline = next(c for c in pair if not c.speculative)
        drafter.name, baseline.name = "drafter", "baseline"
        if not sess.start_power() and objective == "energy":
            raise EdgekitError(f"Board {name!r} has no power readings: `bench.objective: energy` can't be decided "
                               "there (set it to speed, or runtime.spec to on or off).")
        sess.take_board()
        point = Point(concurrency, ctx, temperature)
        matrix = [(drafter, [point]), (baseline, [point])]
        while verdict is None:
            # Power is read back when the session closes: for energy every pair is taken first, then judged.
            reps = MAX_PAIRS if objective == "energy" else FIRST_PAIRS if not runs else 1
            runs += sess.run_matrix(matrix, reps, n_gen, b.warmup, lambda p: requests_per_run(p.concurrency, n_cat),
                                    False, first_rep=len(runs) // 2)
            final = len(runs) // 2 >= MAX_PAIRS
            verdict = "later" if objective == "energy" else judge(_gains(runs, "speed"), rt.spec_min_gain, final)
    check_restored(sess)
    log = sess.power_log
    if log is not None and log.available:
        for r in runs:
            r.power = window_power(log.samples, *r.window, r.metrics["tokens"], None)
    gain = _gains(runs, objective)
    if objective == "energy":
        verdict = judge(gain, rt.spec_min_gain, final=True)
    assert verdict is not None
    drafted = sum(r.metrics.get("draft_n") or 0 for r in runs if r.config == "drafter")
    accepted = sum(r.metrics.get("draft_n_accepted") or 0 for r in runs if r.config == "drafter")
    figures = {
        "objective": objective, "min_gain": rt.spec_min_gain, "concurrency": concurrency, "context_length": ctx,
        "temperature": temperature, "n_gen": n_gen, "pairs": len(runs) // 2, "gain": gain.to_json(4) if gain else None,
        "drafter": {"tokens_per_second": _mean(runs, "drafter", "tokens_per_second"),
                    "joules_per_token": _mean(runs, "drafter", "joules_per_token", power=True),
                    "acceptance": round(accepted / drafted, 4) if drafted else None},
        "target_alone": {"tokens_per_second": _mean(runs, "baseline", "tokens_per_second"),
                         "joules_per_token": _mean(runs, "baseline", "joules_per_token", power=True)},
        "measured_release": sess.release, "seconds": round(time.monotonic() - start, 1),
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    return Verdict(verdict, _reason(verdict, gain, objective, rt.spec_min_gain, concurrency, temperature), figures)


def _current(name: str, board: Board) -> dict[str, Any]:
    with runner_for(board, name) as runner:
        base = probe(runner, board.base).base
        current = releases.layout(runner, base).current
        return releases.read_manifest(runner, base, current) if current else {}


def deploy_auto(name: str, board: Board, recipe: Recipe, options: DeployOptions, console: Console,
                say: Callable[[str], None], progress: Any = None, remeasure: bool = False) -> DeployReport:
    """`edgekit deploy` of a recipe with ``spec: auto`` (see the module's docstring)."""
    start = time.monotonic()
    pushed = push(name, board, recipe, options, console, on_step=say, progress=progress)
    decided = ((_current(name, board).get("runtime") or {}).get("spec_decision") or {})
    if not remeasure and decided.get("measured_release") == pushed.release:  # decided before, for this release
        note = f"spec auto (decided {decided.get('measured_at')}): {decided.get('reason')}; --remeasure measures again"
        return _done(deploy(name, board, recipe.target_alone(decided), options, console, on_step=say),
                     {**decided, "remeasured": False}, note, pushed, start, say)
    report = deploy(name, board, recipe, options, console, on_step=say)
    if not report.changed and not remeasure:
        note = ("spec auto: the drafted release was already served (kept by an earlier measurement, or left by one "
                "that did not finish); --remeasure measures again")
        return _done(report, {"serve": "drafter", "remeasured": False}, note, pushed, start, say)
    say(f"spec auto: the drafter against the target alone on the board ({recipe.bench.objective}, concurrency "
        f"{recipe.runtime.parallel}); the service is stopped meanwhile")
    try:
        verdict = measure(name, board, recipe, options.wait_s, say)
    except EdgekitError as exc:
        raise EdgekitError(f"Release {report.release} is deployed and healthy on board {name!r}, with its drafter, "
                           f"but the A/B that decides on the drafter failed: {exc} (`edgekit deploy --remeasure` "
                           "tries again).") from exc
    if verdict.serve == "target alone":
        report = deploy(name, board, recipe.target_alone(verdict.to_json()), options, console, on_step=say)
    return _done(report, {**verdict.to_json(), "remeasured": True}, f"spec auto: {verdict.reason}", pushed, start,
                 say)


def _done(report: DeployReport, spec: dict[str, Any], note: str, pushed: PushOutcome, start: float,
          say: Callable[[str], None]) -> DeployReport:
    """The report of the whole deploy: what the first push sent, the decision, the time with the A/B."""
    say(note)
    report.spec_auto = spec
    report.notes.append(note)
    report.bytes_sent += pushed.bytes_sent
    report.blobs_sent += pushed.blobs_sent
    report.blobs_skipped = max(0, report.blobs_skipped - pushed.blobs_sent)
    report.link_retries += pushed.link_retries
    report.seconds = round(time.monotonic() - start, 2)
    return report
