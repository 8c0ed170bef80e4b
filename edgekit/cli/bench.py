"""`edgekit bench` and `edgekit tune`: measure a board's deployed release, with and without its drafter."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from edgekit.cli import board_option, json_option
from edgekit.cli.app import App
from edgekit.cli.engine_options import EngineOptionsCommand, collect
from edgekit.config.engine_table import engine_names
from edgekit.engines.recipe_check import load_recipe


def _ints(text: str | None) -> list[int] | None:
    if not text:
        return None
    try:
        values = [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise click.BadParameter(f"{text!r} is not a comma-separated list of integers") from None
    if not values or any(v < 1 for v in values):
        raise click.BadParameter("values must be positive integers")
    return values


def _temperatures(text: str | None) -> list[float] | None:
    if not text:
        return None
    try:
        values = [float(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise click.BadParameter(f"{text!r} is not a comma-separated list of numbers",
                                 param_hint="--temperatures") from None
    if not values or any(not 0.0 <= v <= 2.0 for v in values):
        raise click.BadParameter("temperatures go from 0 (greedy) to 2", param_hint="--temperatures")
    return values


def _p_mins(text: str | None) -> list[float | None] | None:
    """"0,0.5,default" → [0.0, 0.5, None] (None: the server's own default)."""
    if not text:
        return None
    out: list[float | None] = []
    for x in text.replace(" ", "").split(","):
        if x in ("default", "-"):
            out.append(None)
            continue
        try:
            value = float(x)
        except ValueError:
            raise click.BadParameter(f"{x!r} is not a number or 'default'") from None
        if not 0.0 <= value <= 1.0:
            raise click.BadParameter("p-min values lie between 0 and 1")
        out.append(value)
    return out


def _cooldown(text: str | None) -> float | str | None:
    if text is None:
        return "recipe"
    if text.lower() in ("off", "none", "no"):
        return None
    try:
        return float(text)
    except ValueError:
        raise click.BadParameter("--cooldown takes °C or 'off'") from None


def _common(f: Any) -> Any:
    options = [
        board_option,
        click.option("--recipe", "recipe_name", required=True, metavar="RECIPE",
                     help="The recipe the board serves (name or path)."),
        click.option("--quick", is_flag=True, help="Fewer points and repetitions: a smoke test, not a result."),
        click.option("--n-gen", type=click.IntRange(1, 8192), help="Tokens per request (default: recipe)."),
        click.option("--repetitions", type=click.IntRange(1, 100), help="Repetitions (default: recipe)."),
        click.option("--warmup", type=click.IntRange(0, 20), help="Warm-up rounds per run (default: recipe)."),
        click.option("--cooldown", metavar="C|off", help="Cool below C °C before each run (default: recipe)."),
        click.option("--cooldown-timeout", type=float, default=600.0, show_default=True,
                     help="Seconds to wait for the cool-down before running anyway."),
        click.option("--no-power", is_flag=True, help="Don't sample power (throughput only)."),
        click.option("--hz", type=click.FloatRange(1, 200), default=20.0, show_default=True,
                     help="Power samples per second."),
        click.option("--total-rail", metavar="NAME|sum", help="Override the total rail (default: per profile)."),
        click.option("--shared", is_flag=True,
                     help="Keep the deployed service running while measuring (needs memory for two servers; "
                          "its traffic shows in the power figures)."),
        click.option("--ignore-eos", is_flag=True, help="Always generate --n-gen tokens."),
        click.option("--raw-prompts", is_flag=True,
                     help="Send the prompts as written, not through the model's chat template."),
        click.option("--wait", "wait_s", type=click.IntRange(0, 3600), default=0, show_default=True,
                     help="Seconds to wait for a deploy holding the board."),
    ]
    for option in reversed(options):
        f = option(f)
    return f


def _session_opts(kw: dict[str, Any]) -> Any:
    from edgekit.bench.session import SessionOptions

    return SessionOptions(power=not kw["no_power"], hz=kw["hz"], total_rail=kw["total_rail"],
                          exclusive=not kw["shared"], cooldown_timeout_s=kw["cooldown_timeout"],
                          lock_wait_s=kw["wait_s"], raw_prompts=kw["raw_prompts"])


def _backend(backend: str) -> str:
    """release, or an engine whose class can bench the recipe's model without a release (``benches_model``)."""
    from edgekit.engines import get_engine

    if backend != "release" and not get_engine(backend).benches_model:
        raise click.BadParameter(f"{backend} has no bench without a release: deploy the recipe and leave out "
                                 "--backend (the deployed release is measured whatever its engine).",
                                 param_hint="--backend")
    return backend


def _engines(text: str | None, backend: str) -> list[str] | None:
    from edgekit.engines import ENGINES

    if not text:
        return None
    names = [e.strip() for e in text.split(",") if e.strip()]
    bad = [e for e in names if e not in ENGINES]
    if bad or not names or len(set(names)) != len(names):
        raise click.BadParameter(f"{text!r} is not a list of distinct engines from {', '.join(ENGINES)}.",
                                 param_hint="--engines")
    if backend != "release":
        raise click.BadParameter("--engines measures releases; leave out --backend.", param_hint="--engines")
    return names


@click.command(cls=EngineOptionsCommand)
@_common
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path),
              help="Directory for results.json, report.md and plots "
                   "(default: ./bench-results/<board>-<recipe>-<time>).")
@click.option("--concurrency", help="Concurrency levels, e.g. 1,2,4,8 (default: recipe).")
@click.option("--context-lengths", help="Prompt lengths in tokens, e.g. 128,2048 (default: recipe).")
@click.option("--temperatures", metavar="T1,T2,…",
              help="Sampling temperatures of the load, e.g. 0,0.7: 0 is greedy; each is a point of its own, "
                   "acceptance and speedup side by side (default: recipe's bench.temperatures).")
@click.option("--slots", default="auto", show_default=True,
              help="Server slots while benching: auto (the highest concurrency), deployed, or a number.")
@click.option("--idle", "idle_s", type=click.FloatRange(0.5, 600),
              help="Seconds of idle baseline (default 5, quick 2).")
@click.option("--no-llama-bench", is_flag=True, help="Skip llama-bench (pp/tg of the target alone).")
@click.option("--no-plots", is_flag=True, help="Write results.json and report.md only.")
@click.option("--engines", "engines", metavar="E1,E2,…",
              help=f"Measure several engines' releases side by side in one run ({', '.join(engine_names())}): "
                   "the deployed one and the board's newest release of each other engine, alternated.")
@click.option("--backend", type=click.Choice(["release", *engine_names()]), default="release", show_default=True,
              help="release: the deployed release (whatever its engine). An engine: the recipe's model through "
                   "it, pushed for the bench alone, where the engine can (LiteRT-LM: its .litertlm, target + "
                   "MTP drafter).")
@click.option("--power-modes", "power_modes", metavar="M1,M2,…",
              help="Run the bench at each of these nvpmodel modes (ids or names, e.g. 0,15W) and compare them: "
                   "tok/s, J/token, W and the Pareto front (modes.json, modes.md, pareto.png). The board's mode is "
                   "put back afterwards, also after Ctrl-C or if edgekit is killed.")
@click.option("--lock-clocks", is_flag=True,
              help="With --power-modes: pin the clocks with jetson_clocks in each mode (restored afterwards).")
@click.option("--keep-throttled", is_flag=True,
              help="Keep runs in which the board throttled (a zone past its trip point, a clock cap lowered) in the "
                   "summary; by default they are flagged and left out.")
@json_option
@click.pass_obj
def bench(app: App, board_name: str, recipe_name: str, out_dir: Path | None, concurrency: str | None,
          context_lengths: str | None, temperatures: str | None, slots: str, idle_s: float | None,
          no_llama_bench: bool, no_plots: bool, engines: str | None, backend: str, power_modes: str | None,
          lock_clocks: bool, keep_throttled: bool, **kw: Any) -> None:
    """Measure the deployed release on a board with and without its drafter: tok/s, TTFT, acceptance, J/token.

    The board's service is stopped while measuring (unless --shared) and started again afterwards,
    also after Ctrl-C. Results: JSON first (edgekit/data/results-schema.json), then Markdown and PNGs.
    --engines llama.cpp,vllm,litert-lm measures those engines' releases on the board in one run.
    --backend litert-lm measures the recipe's .litertlm (target + MTP drafter) through LiteRT-LM instead.
    """
    from edgekit.bench import orchestrate
    from edgekit.bench.plan import Overrides

    board = app.board(board_name)
    recipe = load_recipe(recipe_name)
    ov = Overrides(concurrency=_ints(concurrency), context_lengths=_ints(context_lengths),
                   temperatures=_temperatures(temperatures), n_gen=kw["n_gen"], repetitions=kw["repetitions"],
                   warmup=kw["warmup"], cooldown_temp_c=_cooldown(kw["cooldown"]), slots=slots, idle_s=idle_s)
    opts = orchestrate.BenchOptions(out_dir=out_dir, quick=kw["quick"], overrides=ov, session=_session_opts(kw),
                                    llama_bench=not no_llama_bench, ignore_eos=kw["ignore_eos"], plots=not no_plots,
                                    backend=_backend(backend), engines=_engines(engines, backend),
                                    engine_options=collect(kw), keep_throttled=keep_throttled)
    if lock_clocks and not power_modes:
        raise click.BadParameter("--lock-clocks goes with --power-modes.", param_hint="--lock-clocks")
    if power_modes:
        _modes(app, board_name, board, recipe, opts, power_modes, lock_clocks, out_dir)
        return
    # Ctrl-C inside: the session puts the board back and raises Interrupted (exit 130).
    doc = orchestrate.measure(board_name, board, recipe, opts, say=lambda m: app.info(f"[dim]{board_name}:[/] {m}"))
    target = out_dir or orchestrate.default_out_dir(board_name, recipe.name)
    files = orchestrate.write(doc, target, with_plots=not no_plots)

    def human() -> None:
        app.out.print(f"[bold]{doc['summary']['headline']['text']}[/bold]")
        pw = doc["power"]
        if not pw.get("available"):
            app.out.print(f"Power unavailable: {pw.get('reason')}")
        app.out.print(f"Results: {files['results']}  report: {files['report']}")

    app.emit(doc, human)


def _modes(app: App, board_name: str, board: Any, recipe: Any, opts: Any, power_modes: str, lock_clocks: bool,
           out_dir: Path | None) -> None:
    from edgekit.bench import orchestrate
    from edgekit.bench import power_modes as pm

    wanted = [m.strip() for m in power_modes.split(",") if m.strip()]
    if not wanted:
        raise click.BadParameter("name at least one mode, e.g. 0,15W", param_hint="--power-modes")
    target = out_dir or orchestrate.default_out_dir(board_name, recipe.name)
    doc = pm.measure_modes(board_name, board, recipe, opts, wanted, lock_clocks, target,
                           say=lambda m: app.info(f"[dim]{board_name}:[/] {m}"))

    def human() -> None:
        for p in doc["front"]:
            app.out.print(f"front: mode {p['mode']} ({p['mode_name']}) {p['config']} c={p['concurrency']}: "
                          f"{p['tokens_per_second']:.1f} tok/s, {p['joules_per_token']:.4f} J/token")
        app.out.print(f"Results: {target / 'modes.json'}  report: {target / 'modes.md'}")

    app.emit(doc, human)


@click.command()
@_common
@click.option("--objective", type=click.Choice(["speed", "energy"]),
              help="Maximise tok/s, or minimise J/token (default: the recipe's bench.objective, speed).")
@click.option("--draft-n", "draft_n", default="1,2,3,4,5,6,7,8", show_default=True,
              help="Draft lengths to try (llama-server's --spec-draft-n-max, vLLM's num_speculative_tokens).")
@click.option("--p-min", "p_min", default=None,
              help="--spec-draft-p-min values to try; 'default' = the server's (default: default,0.5,0.8; quick "
                   "and vLLM, which has no p-min: default).")
@click.option("--parallel", "parallel", default=None,
              help="Server slots to try, e.g. 1,2,4 (each measured at that many concurrent requests).")
@click.option("--kv-types", "kv_types", default=None, metavar="T1,T2,…",
              help="KV cache types to try, e.g. f16,q8_0 (llama.cpp's -ctk/-ctv; the drafter's too; where flash "
                   "attention is off, a quantized type goes to K alone).")
@click.option("--context-length", type=click.IntRange(1, 1 << 20), help="Prompt length (default: recipe's first).")
@click.option("--min-gain", type=click.FloatRange(0, 10, min_open=True), metavar="X",
              help="Deploy a drafted setting only if it beats the target alone by more than X× (default: the "
                   "recipe's runtime.spec_min_gain, 1.0); otherwise the target alone is deployed.")
@click.option("--power-modes", "power_modes", metavar="M1,M2,…",
              help="Sweep at each of these nvpmodel modes (ids or names); the best mode and setting by the objective "
                   "are deployed and the board is left at that mode.")
@click.option("--lock-clocks", is_flag=True, help="With --power-modes: pin the clocks with jetson_clocks while "
                                                  "measuring (restored afterwards).")
@click.option("--no-deploy", is_flag=True, help="Show the table only; don't write the best setting to the board.")
@click.option("--src", metavar="PATH", help="llama.cpp source for the deploy (as for `edgekit deploy`).")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path),
              help="Also write tune.json and the tuned recipe (<recipe>.tuned.yaml) here.")
@json_option
@click.pass_obj
def tune(app: App, board_name: str, recipe_name: str, objective: str | None, draft_n: str, p_min: str | None,
         parallel: str | None, kv_types: str | None, context_length: int | None, min_gain: float | None,
         power_modes: str | None,
         lock_clocks: bool, no_deploy: bool, src: str | None, out_dir: Path | None, **kw: Any) -> None:
    """Sweep draft length and p-min (and slots) on a board, pick the best, deploy it as a new release.

    Where no drafted setting beats the target alone (by --min-gain), the target alone is deployed, and its
    release.json says why.
    """
    from rich.table import Table

    from edgekit.bench import tune as tune_mod

    board = app.board(board_name)
    recipe = load_recipe(recipe_name)
    objective = objective or recipe.bench.objective
    if kw["quick"] and draft_n == "1,2,3,4,5,6,7,8":
        draft_n = "1,3"
    grid = tune_mod.Grid(draft_n=_ints(draft_n) or [recipe.runtime.draft_n_max],
                         p_min=_p_mins(p_min),
                         parallel=_ints(parallel),
                         kv_types=[k.strip() for k in kv_types.split(",") if k.strip()] if kv_types else None)
    opts = tune_mod.TuneOptions(objective=objective, quick=kw["quick"], n_gen=kw["n_gen"],
                                repetitions=kw["repetitions"], warmup=kw["warmup"],
                                cooldown_temp_c=_cooldown(kw["cooldown"]), context_length=context_length,
                                session=_session_opts(kw), ignore_eos=kw["ignore_eos"], deploy=not no_deploy, src=src,
                                out_dir=out_dir, min_gain=min_gain)
    if lock_clocks and not power_modes:
        raise click.BadParameter("--lock-clocks goes with --power-modes.", param_hint="--lock-clocks")
    say = lambda m: app.info(f"[dim]{board_name}:[/] {m}")  # noqa: E731
    if power_modes:
        wanted = [m.strip() for m in power_modes.split(",") if m.strip()]
        result = tune_mod.tune_modes(board_name, board, recipe, grid, opts, wanted, lock_clocks, app.console, say)
    else:
        result = tune_mod.tune(board_name, board, recipe, grid, opts, app.console, say)

    def human() -> None:
        unit = "tok/s" if objective == "speed" else "J/token"
        table = Table(title=f"tune {recipe.name} on {board_name} (objective: {objective})")
        kv = any(row.get("cache_type_k") for row in result["table"])
        for col in ("setting", "draft_n_max", "p_min", "slots", *(["KV cache"] if kv else []), "tok/s", "J/token",
                    "acceptance", ""):
            table.add_column(col)
        for row in result["table"]:
            p = row.get("draft_p_min")
            table.add_row(row["name"], str(row.get("draft_n_max") or "–"),
                          "default" if p is None and row["speculative"] else str(p if p is not None else "–"),
                          str(row["parallel"]), *([f"{row['cache_type_k']}/{row['cache_type_v']}"] if kv else []),
                          tune_mod.fmt(row["tokens_per_second"], 1),
                          tune_mod.fmt(row["joules_per_token"], 4),
                          "–" if row["acceptance"] is None else f"{row['acceptance']:.0%}",
                          "best" if row["name"] == result["best"]["name"] else ("tie" if row.get("tied") else ""))
        app.out.print(table)
        for m in result.get("modes") or []:
            b = m["best"]
            app.out.print(f"mode {m['mode']} ({m['mode_name']}): best {b['name'] if m['drafter'] else 'no drafter'}, "
                          f"{tune_mod.fmt(b['tokens_per_second'], 1)} tok/s, {tune_mod.fmt(b['joules_per_token'], 4)} "
                          "J/token")
        best = result["best"]["name"] if result["drafter"] else "no drafter"
        app.out.print(f"Best by {unit}: {best}. " + result["message"])

    app.emit(result, human)
