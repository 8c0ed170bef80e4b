"""`edgekit tune`: sweep the drafter's settings on the board, pick the best, deploy it.

Every grid point is the deployed release's server with its draft length changed (llama-server's
``--spec-draft-n-max`` / ``--spec-draft-p-min``; vLLM's ``num_speculative_tokens``), and slots; the
baseline without speculative decoding is measured beside them for reference. Points run round-robin
per repetition (as the bench alternates its two configurations), each at as many concurrent requests
as it has slots. The best point by the objective (mean tok/s, or mean J/token) is reported with its
CI95 and the points whose interval overlaps it ("tie"); then the recipe's runtime with those values
goes through the deploy pipeline and becomes a new release on the board. Worth doing per board: in a
published user report (Gemma 4 E2B/E4B with their MTP drafters in llama.cpp on an RTX 3050 and a GTX 1650 Ti,
"Do Drafters Work on Small Models?", github.com/xbill9/gemma4-dev) too many drafted tokens cost speed on the
slower card, and the gain shrank with concurrency on both.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console

from edgekit.bench import engines, prompts
from edgekit.bench.power import window_power
from edgekit.bench.session import BoardRelease, Run, Session, SessionOptions, check_restored
from edgekit.bench.stats import Estimate, estimate
from edgekit.bench.workloads import Point, requests_per_run
from edgekit.config.boardfile import Board
from edgekit.config.recipes import ModelSource, Recipe
from edgekit.engines import get_engine
from edgekit.engines.benchconf import BenchSite, ServerConfig
from edgekit.errors import EdgekitError


@dataclass
class Grid:
    draft_n: list[int]
    p_min: list[float | None] | None  # None in the list: the server's default; None: the engine's grid
    parallel: list[int] | None = None  # None: as deployed
    kv_types: list[str] | None = None  # the KV cache types to try (the engine's kv_cache_types); None: as deployed


@dataclass
class TuneOptions:
    objective: str = "speed"  # speed | energy
    quick: bool = False
    n_gen: int | None = None
    repetitions: int | None = None
    warmup: int | None = None
    cooldown_temp_c: float | str | None = "recipe"
    context_length: int | None = None
    session: SessionOptions = field(default_factory=SessionOptions)
    ignore_eos: bool = False
    deploy: bool = True
    src: str | None = None
    out_dir: Path | None = None
    min_gain: float | None = None  # the drafter is deployed only above this gain (None: runtime.spec_min_gain)


def fmt(e: dict[str, Any] | None, digits: int) -> str:
    if not e:
        return "–"
    return f"{e['mean']:.{digits}f}" + (f" ± {e['ci95']:.{digits}f}" if e.get("ci95") is not None else "")


def _pname(p: float | None) -> str:
    return "pdef" if p is None else f"p{p:g}"


def configs(rel: BoardRelease, board: Board, port: int, grid: Grid, deployed_parallel: int,
            slot_ctx: int) -> list[tuple[ServerConfig, list[Point]]]:
    """Every grid point in the release's engine's spelling, and the baseline beside them, per slot count."""
    out = []
    engine = get_engine(rel.engine)
    if grid.kv_types and (bad := [k for k in grid.kv_types if k not in engine.kv_cache_types]):
        raise EdgekitError(f"{engine.name} has no KV cache type {bad[0]!r} to tune"
                           + (f" (it has {', '.join(engine.kv_cache_types)})." if engine.kv_cache_types else "."))
    for slots in grid.parallel or [deployed_parallel]:
        for kv in grid.kv_types or [None]:
            suffix = (f"-s{slots}" if grid.parallel else "") + (f"-kv{kv}" if kv else "")
            pair = engines.configs(rel, board, port, slots, slot_ctx)
            if kv is not None:  # the drafter and the baseline beside it, both at that cache
                pair = [engine.tune_kv_cache(c, kv) for c in pair]
            drafter = next((c for c in pair if c.speculative), None)
            if drafter is None:
                raise EdgekitError(f"Release {rel.id} has no speculative decoding to tune.")
            for n in grid.draft_n:
                for p in grid.p_min or [None]:
                    cfg = engines.tune_point(rel, drafter, n, p)
                    cfg.name = f"n{n}-{_pname(p)}{suffix}"
                    cfg.settings["parallel"] = slots
                    out.append(cfg)
            base = next(c for c in pair if not c.speculative)
            base.name = f"baseline{suffix}"
            base.settings["parallel"] = slots
            out.append(base)
    return [(c, [Point(int(c.settings["parallel"]), None)]) for c in out]


def export_configs(sess: Session, board: Board, recipe: Recipe, grid: Grid,
                   say: Callable[[str], None]) -> list[tuple[ServerConfig, list[Point]]]:
    """An engine whose draft length is fixed when its model is exported (``tunes_by_export``): one model per
    length, each pushed into the session's work dir by the engine; the release itself is the baseline."""
    rel = sess.release_for(sess.engine)
    engine = get_engine(rel.engine)
    site = BenchSite(sess.name, board, sess.runner, sess.facts.base if sess.facts else board.base, sess.work,
                     sess.agent, sess.bench_port, say)
    out = engine.tune_drafters(site, rel.manifest, recipe, grid.draft_n, grid.p_min, grid.parallel)
    (baseline,) = [c for c in engines.configs(rel, board, sess.bench_port, None, None) if not c.speculative]
    baseline.settings["parallel"] = 1
    return [(c, [Point(1, None)]) for c in [*out, baseline]]


def _line(run: Run, total: int) -> str:
    acc = run.metrics.get("acceptance")
    return (f"run {run.index + 1}/{total}: {run.config}: {run.metrics.get('tokens_per_second') or 0:.1f} tok/s"
            + (f", acceptance {acc:.0%}" if acc is not None else ""))


def _row(cfg: ServerConfig, runs: list[Run]) -> dict[str, Any]:
    mine = [r for r in runs if r.config == cfg.name]
    tps = estimate([r.metrics["tokens_per_second"] for r in mine if r.metrics.get("tokens_per_second")])
    jpt = estimate([r.power["joules_per_token"] for r in mine if r.power and r.power.get("joules_per_token")])
    drafted = sum(r.metrics.get("draft_n") or 0 for r in mine)
    acc = sum(r.metrics.get("draft_n_accepted") or 0 for r in mine) / drafted if drafted else None
    return {"name": cfg.name, "speculative": cfg.speculative, "draft_n_max": cfg.settings.get("draft_n_max"),
            "draft_p_min": cfg.settings.get("draft_p_min"), "parallel": cfg.settings.get("parallel"),
            "cache_type_k": cfg.settings.get("cache_type_k"), "cache_type_v": cfg.settings.get("cache_type_v"),
            "tokens_per_second": tps.to_json() if tps else None,
            "joules_per_token": jpt.to_json() if jpt else None, "acceptance": acc, "repetitions": len(mine),
            "_tps": tps, "_jpt": jpt}


def choose(rows: list[dict[str, Any]], objective: str) -> tuple[dict[str, Any], list[str]]:
    """The best speculative row by the objective, and the rows statistically tied with it."""
    key = "_tps" if objective == "speed" else "_jpt"
    cands = [r for r in rows if r["speculative"] and r[key] is not None]
    if not cands:
        raise EdgekitError("No speculative setting produced a measurement"
                           + (" with power figures (is power available on this board?)" if objective == "energy"
                              else "") + ".")
    best = (max if objective == "speed" else min)(cands, key=lambda r: r[key].mean)
    b: Estimate = best[key]
    tied = [r["name"] for r in cands if r is not best and r[key].overlaps(b)]
    return best, tied


def tune(name: str, board: Board, recipe: Recipe, grid: Grid, opts: TuneOptions, console: Console,
         say: Callable[[str], None]) -> dict[str, Any]:
    result, tuned = measure(name, board, recipe, grid, opts, say)
    return finish(name, board, recipe, result, tuned, opts, console, say)


def measure(name: str, board: Board, recipe: Recipe, grid: Grid, opts: TuneOptions,
            say: Callable[[str], None]) -> tuple[dict[str, Any], Recipe]:
    """The sweep on the board as it is now, the best setting (or the target alone), and the recipe that serves
    it; nothing deployed."""
    b = recipe.bench
    prompt_set = prompts.load(b.prompt_set)
    n_cat = len(prompts.categories(prompt_set))
    reps = opts.repetitions or (2 if opts.quick else b.repetitions)
    n_gen = opts.n_gen or (min(b.n_gen, 64) if opts.quick else b.n_gen)
    warmup = b.warmup if opts.warmup is None else opts.warmup
    ctx = opts.context_length or min(b.context_lengths)
    sopts = opts.session
    sopts.cooldown_temp_c = b.cooldown_temp_c if opts.cooldown_temp_c == "recipe" else opts.cooldown_temp_c  # type: ignore[assignment]
    if opts.objective == "energy" and not sopts.power:
        raise EdgekitError("--objective energy needs power sampling (drop --no-power).")
    sess = Session(name, board, recipe, sopts, say=say)
    with sess:
        if not sess.manifest.get("drafter"):
            raise EdgekitError(f"Release {sess.release} on board {name!r} has no speculative decoding to tune.")
        engine = get_engine(sess.engine)
        if grid.p_min is None:  # the engine's p-min grid (where it has one); a smoke test leaves the default
            grid.p_min = [None] if opts.quick else list(engine.tune_p_mins)
        if engine.tunes_by_export:
            if grid.kv_types:
                raise EdgekitError(f"{engine.name} has no KV cache types to tune.")
            matrix = export_configs(sess, board, recipe, grid, say)
        else:
            matrix = configs(sess.release_for(sess.engine), board, sess.bench_port, grid, recipe.runtime.parallel,
                             ctx + n_gen + 256)
        # At the recipe's clients' temperature, as `spec: auto` decides: the drafter settings that win greedy
        # may not win sampled.
        temperature = recipe.runtime.client_temperature or 0.0
        matrix = [(c, [Point(p.concurrency, ctx, temperature) for p in pts]) for c, pts in matrix]
        power_on = sess.start_power()
        if opts.objective == "energy" and not power_on:
            raise EdgekitError(f"Board {name!r} has no power readings: --objective energy can't be measured there.")
        sess.take_board()
        runs = sess.run_matrix(matrix, reps, n_gen, warmup, lambda p: requests_per_run(p.concurrency, n_cat),
                               opts.ignore_eos, on_run=lambda r, n: say(_line(r, n)))
    check_restored(sess)
    log = sess.power_log
    if log is not None and log.available:
        for r in runs:
            r.power = window_power(log.samples, *r.window, r.metrics["tokens"], None)
    rows = [_row(c, runs) for c, _ in matrix]
    best, tied = choose(rows, opts.objective)
    for r in rows:
        r["tied"] = r["name"] in tied
    ref = next((r for r in rows if not r["speculative"] and r["parallel"] == best["parallel"]
                and r["cache_type_k"] == best["cache_type_k"] and r["cache_type_v"] == best["cache_type_v"]), None)
    min_gain = recipe.runtime.spec_min_gain if opts.min_gain is None else opts.min_gain
    gain = _gain(best, ref, opts.objective)
    message = ""
    if gain is not None and gain <= min_gain:  # the target alone wins: that is what gets deployed
        what = "tok/s" if opts.objective == "speed" else "tokens per joule"
        message = (f"the target alone is served: the best drafted setting, {best['name']}, gives {gain:.2f}× its "
                   f"{what} at {best['parallel']} slot(s), not above {min_gain:g}×")
        decision = {"serve": "target alone", "reason": message, "by": "tune", "objective": opts.objective,
                    "min_gain": min_gain, "gain": round(gain, 4), "measured_release": sess.release,
                    "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                    "drafter": {k: v for k, v in best.items() if not k.startswith("_")},
                    "target_alone": {k: v for k, v in ref.items() if not k.startswith("_")} if ref else None}
        best, message = ref or best, message[0].upper() + message[1:] + ". "
        tuned = recipe.target_alone(decision)
        tuned = tuned.model_copy(update={"runtime": tuned.runtime.model_copy(update={
            "parallel": best["parallel"] or recipe.runtime.parallel})})
        if best["cache_type_k"] is not None:
            tuned = tuned.model_copy(update={"runtime": get_engine(sess.engine).runtime_with_kv_cache(
                tuned.runtime, best["cache_type_k"], best["cache_type_v"])})
        runtime = tuned.runtime
    else:
        runtime = recipe.runtime.model_copy(update={
            "draft_n_max": best["draft_n_max"], "draft_p_min": best["draft_p_min"],
            "draft_n_min": min(recipe.runtime.draft_n_min, best["draft_n_max"]),
            "parallel": best["parallel"] or recipe.runtime.parallel})
        if best["cache_type_k"] is not None:  # tuned over KV cache types: the chosen one is served
            runtime = get_engine(sess.engine).runtime_with_kv_cache(runtime, best["cache_type_k"],
                                                                    best["cache_type_v"])
        tuned = recipe.model_copy(update={"runtime": runtime, "drafter": _measured_drafter(recipe)})
    clean = [{k: v for k, v in r.items() if not k.startswith("_")} for r in rows]
    best_clean = next(r for r in clean if r["name"] == best["name"])
    result = {"kind": "tune", "board": name, "recipe": recipe.name, "release_measured": sess.release,
              "objective": opts.objective, "repetitions": reps, "n_gen": n_gen, "context_length": ctx,
              "temperature": recipe.runtime.client_temperature or 0.0,
              "power": {"available": bool(log and log.available), "total_rail_method": sess.rail.method
                        if sess.rail else None},
              "table": clean, "best": best_clean, "tied_with_best": tied, "drafter": bool(best["speculative"]),
              "drafter_gain": round(gain, 4) if gain is not None else None, "min_gain": min_gain,
              "runtime": runtime.model_dump(mode="json"), "deployed": None, "message": message.strip(),
              "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    return result, tuned


def finish(name: str, board: Board, recipe: Recipe, result: dict[str, Any], tuned: Recipe, opts: TuneOptions,
           console: Console, say: Callable[[str], None]) -> dict[str, Any]:
    """Deploy what the sweep chose (unless --no-deploy); tune.json and the tuned recipe into --out."""
    if opts.deploy:
        from edgekit.deploy.pipeline import DeployOptions, deploy

        say(f"deploying {result['best']['name']} as a new release")
        report = deploy(name, board, tuned, DeployOptions(src=opts.src, wait_s=opts.session.lock_wait_s), console,
                        on_step=lambda m: say(m))
        result["deployed"] = report.to_dict()
        done = (f"Deployed as release {report.release}." if report.changed
                else f"Release {report.release} already had these settings.")
    else:
        done = "Not deployed (--no-deploy)."
    result["message"] = f"{result['message'].strip()} {done}".strip()
    if opts.out_dir is not None:
        opts.out_dir.mkdir(parents=True, exist_ok=True)
        import json

        (opts.out_dir / "tune.json").write_text(json.dumps(result, indent=1) + "\n")
        data = tuned.model_dump(mode="json", exclude_defaults=True)
        (opts.out_dir / f"{recipe.name}.tuned.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    return result


def _gain(best: dict[str, Any], ref: dict[str, Any] | None, objective: str) -> float | None:
    """The best drafted row over the target alone at its slots: tok/s ratio, or the inverse J/token ratio."""
    key = "_tps" if objective == "speed" else "_jpt"
    if ref is None or not ref[key] or not best[key] or not ref[key].mean or not best[key].mean:
        return None
    return best[key].mean / ref[key].mean if objective == "speed" else ref[key].mean / best[key].mean


def _measured_drafter(recipe: Recipe) -> ModelSource | None:
    """The drafter that was measured: an aligned drafter keeps the K it was fitted for.

    Its ``align.k`` defaults to ``runtime.draft_n_max``; without pinning it, deploying a new draft
    length would re-fit the drafter (minutes to hours) and deploy one that was never measured.
    """
    drafter = recipe.drafter
    if drafter is None or drafter.align is None or drafter.align.k is not None:
        return drafter
    return drafter.model_copy(update={"align": drafter.align.model_copy(update={"k": recipe.runtime.draft_n_max})})


def tune_modes(name: str, board: Board, recipe: Recipe, grid: Grid, opts: TuneOptions, wanted: list[str],
               lock_clocks: bool, console: Console, say: Callable[[str], None]) -> dict[str, Any]:
    """The sweep at each nvpmodel mode; the best of all by the objective — its mode and its setting — is what
    gets deployed, and the board is left at that mode (nvpmodel keeps it across reboots)."""
    from edgekit.bench import power_modes

    per_mode: list[tuple[int, str, dict[str, Any], Recipe]] = []
    with power_modes.modes_session(name, board, say, lock_clocks) as (set_mode, modes):
        for mode, mode_name in power_modes.resolve(wanted, modes, name):
            set_mode(mode, mode_name)
            result, tuned = measure(name, board, recipe, grid, opts, say)
            per_mode.append((mode, mode_name, result, tuned))
    key = "tokens_per_second" if opts.objective == "speed" else "joules_per_token"
    scored = [x for x in per_mode if x[2]["best"].get(key)]
    if not scored:
        raise EdgekitError(f"No power mode gave a {key.replace('_', ' ')} figure to choose by.")
    mode, mode_name, result, tuned = (max if opts.objective == "speed" else min)(
        scored, key=lambda x: x[2]["best"][key]["mean"])
    if opts.deploy:
        power_modes.keep_mode(name, board, mode, mode_name, say)
    result["message"] = (f"Power mode {mode} ({mode_name}) is the best by {opts.objective}"
                         + (" (clocks were locked while measuring)" if lock_clocks else "") + ". " + result["message"])
    result["power_mode"] = {"id": mode, "name": mode_name, "kept": opts.deploy, "clocks_locked_while_measuring":
                            lock_clocks}
    result["modes"] = [{"mode": m, "mode_name": n, "best": r["best"], "drafter": r["drafter"], "message": r["message"]}
                       for m, n, r, _ in per_mode]
    result = finish(name, board, recipe, result, tuned, opts, console, say)
    if opts.deploy:
        result["message"] += f" The board stays at power mode {mode} ({mode_name})."
    return result
