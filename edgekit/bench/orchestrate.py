"""`edgekit bench`: the whole measurement on one board, from plan to results document.

    sampler on → deployed service stopped → idle baseline → llama-bench pp / tg →
    repetitions × [drafter, baseline] × points (cool-down before each run) → everything put back
    → energy per window → summary, speedup, roofline → results.json, report.md, PNGs
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgekit import __version__, optional
from edgekit.bench import engines, heat, memory_points, plots, prompts, report, results, roofline
from edgekit.bench.plan import Overrides, Plan, make_plan
from edgekit.bench.power import window_power
from edgekit.bench.session import BoardRelease, Run, Session, SessionOptions, check_restored
from edgekit.config.boardfile import Board
from edgekit.config.profiles import get_profile
from edgekit.config.recipes import Recipe
from edgekit.engines import get_engine
from edgekit.engines.benchconf import BenchSite, ServerConfig


@dataclass
class BenchOptions:
    out_dir: Path | None = None
    quick: bool = False
    overrides: Overrides = field(default_factory=Overrides)
    session: SessionOptions = field(default_factory=SessionOptions)
    llama_bench: bool = True
    ignore_eos: bool = False
    plots: bool = True
    backend: str = "release"  # or an engine that benches_model (litert-lm: the recipe's .litertlm), not a release
    engines: list[str] | None = None  # the engines' releases to measure side by side (None: the deployed one)
    # engine name → the values of its own bench options (EngineBase.bench_options, e.g. LiteRT-LM's python)
    engine_options: dict[str, dict[str, Any]] = field(default_factory=dict)
    keep_throttled: bool = False  # runs the board throttled in stay in the summary (bench/heat.py)


def default_out_dir(board: str, recipe: str) -> Path:
    return Path("bench-results") / f"{board}-{recipe}-{time.strftime('%Y%m%d-%H%M%S')}"


def _run_line(run: Run, total: int) -> str:
    m = run.metrics
    acc = f", acceptance {m['acceptance']:.0%}" if m.get("acceptance") is not None else ""
    tps = m.get("tokens_per_second")
    return (f"run {run.index + 1}/{total}: {run.config:<9} {run.point.label():<14} rep {run.repetition + 1}: "
            f"{tps:.1f} tok/s, TTFT p50 {m.get('ttft_p50_s') or 0:.3f} s{acc}" if tps is not None
            else f"run {run.index + 1}/{total}: {run.config} {run.point.label()}: no tokens")


def measure(name: str, board: Board, recipe: Recipe, opts: BenchOptions,
            say: Callable[[str], None]) -> dict[str, Any]:
    """Run the bench and return the results document (nothing written yet)."""
    prompt_set = prompts.load(recipe.bench.prompt_set)
    plan = make_plan(recipe, opts.overrides, opts.quick, len(prompts.categories(prompt_set)))
    sopts = opts.session
    sopts.cooldown_temp_c = plan.cooldown_temp_c
    model_engine = get_engine(opts.backend) if opts.backend != "release" else None
    model = model_engine.bench_model(recipe, plan.fits, say) if model_engine else None  # on the host, first
    sess = Session(name, board, recipe, sopts, say=say)
    with sess:
        rels: list[BoardRelease] = []
        if model_engine is not None:
            site = BenchSite(name, board, sess.runner, sess.facts.base if sess.facts else board.base, sess.work,
                             sess.agent, sess.bench_port, say)
            configs = model_engine.model_configs(site, model, opts.engine_options.get(model_engine.name) or {})
        else:
            rels = [sess.release_for(e) for e in (opts.engines or [sess.engine])]
            plan = memory_points.fit(plan, [r.manifest for r in rels], _stopped_service(sess),
                                     sess.facts.mem_available_mb if sess.facts else None, say)
            configs = release_configs(rels, board, sess.bench_port, plan, opts.engine_options)
        llama = _llama_bench_release(rels)  # llama-bench and the GGUF roofline: an engine that ships them
        power_on = sess.start_power()
        sess.take_board()
        idle = sess.idle(plan.idle_s) if power_on else None
        lb = (sess.llama_bench(plan.llama_bench_pp, plan.n_gen, plan.llama_bench_reps, llama)
              if opts.llama_bench and llama else [])
        runs = sess.run_matrix([(c, plan.points) for c in configs], plan.repetitions, plan.n_gen, plan.warmup,
                               plan.requests, opts.ignore_eos, on_run=lambda r, n: say(_run_line(r, n)))
        gguf = (roofline.read_remote_header(sess.runner, f"{llama.dir}/{get_engine(llama.engine).target_gguf}")
                if llama else None)
    check_restored(sess)
    doc = build_document(sess, plan, configs, runs, lb, idle, gguf, opts, rels)
    if model_engine is not None:
        doc.update(model_engine.model_record(model))
    doc["_power_samples"] = sess.power_text  # written beside results.json, not into it
    return doc


def _stopped_service(sess: Session) -> dict[str, Any] | None:
    """The deployed release whose memory the bench frees by stopping its service (None: it keeps running)."""
    active = sess.service_before is not None and sess.service_before.active
    return sess.manifest if active and sess.opts.exclusive else None


def release_configs(rels: list[BoardRelease], board: Board, port: int, plan: Plan,
                    options: dict[str, dict[str, Any]] | None = None) -> list[ServerConfig]:
    """Every release's [drafter, baseline], named ``<engine>/<config>`` when several engines are measured."""
    out: list[ServerConfig] = []
    for rel in rels:
        get_engine(rel.engine).check_bench_fits(rel.manifest, rel.id, plan.fits)
        for cfg in engines.configs(rel, board, port, plan.parallel, plan.slot_ctx, options):
            if len(rels) > 1:
                cfg.name = f"{rel.engine}/{cfg.name}"
            out.append(cfg)
    return out


def _llama_bench_release(rels: list[BoardRelease]) -> BoardRelease | None:
    """The first release whose engine ships llama-bench and a GGUF target (``target_gguf``)."""
    return next((r for r in rels if get_engine(r.engine).target_gguf), None)


def build_document(sess: Session, plan: Plan, configs: list[ServerConfig], runs: list[Run],
                   llama_bench: list[dict[str, Any]], idle: tuple[float, float] | None,
                   gguf: roofline.GGUFInfo | None, opts: BenchOptions,
                   rels: list[BoardRelease] | None = None) -> dict[str, Any]:
    profile = get_profile(sess.board.profile)
    log = sess.power_log
    if log is not None and idle is not None:
        log.measure_idle(*idle)
    available = log is not None and log.available
    baseline_w = log.baseline_w if log is not None else None
    run_docs = []
    for run in runs:
        doc = run.to_json()
        if available:
            t0, t1 = run.window
            doc["power"] = window_power(log.samples, t0, t1, run.metrics["tokens"], baseline_w)  # type: ignore[union-attr]
        else:
            doc["power"] = {"available": False, "reason": "power unavailable"}
        run_docs.append(doc)
    for lb in llama_bench:
        w = lb.get("window") or {}
        if available and w.get("start") is not None and w.get("end") is not None:
            p = window_power(log.samples, w["start"], w["end"], None, baseline_w)  # type: ignore[union-attr]
            tps = lb.get("avg_ts")
            if p.get("available") and p.get("average_watts") and tps:
                p["joules_per_token_estimate"] = round(p["average_watts"] / tps, 9)  # window includes model load
            lb["power"] = p
    if log is not None:
        power = log.summary(sess.rail, [d["power"] for d in run_docs])  # type: ignore[arg-type]
    else:
        power = {"available": False, "reason": "power sampling was turned off (--no-power)",
                 "total_rail_method": sess.rail.method if sess.rail else None}
    throttled, trips = heat.mark(run_docs, sess.power_text)
    measured, heat_note = heat.kept(run_docs, opts.keep_throttled)  # what the summary is made of
    summary = results.summarize(measured)
    model = sess.recipe.target.repo or sess.recipe.target.synthetic or sess.recipe.target.package or "the model"
    names = [r.engine for r in rels or []]
    if len(names) > 1:
        ups = results.engine_speedups(measured, names)
        table = results.engines_table(summary, ups, names)
        head = results.engines_headline(table, ups)
    else:
        ups, table = results.speedups(measured), None
        head = results.headline(summary, ups, model)
    gguf_rel = _llama_bench_release(rels or [])  # the roofline is the GGUF's: that engine's configurations
    pre = f"{gguf_rel.engine}/" if len(names) > 1 and gguf_rel else ""
    base_pt = next((p for p in summary if p["config"] == f"{pre}baseline"), None)
    spec_pt = next((p for p in summary if p["config"] == f"{pre}drafter"), None)

    def decode(p: dict[str, Any] | None) -> float | None:
        e = p and p.get("decode_tokens_per_second")
        return round(e["mean"], 4) if e else None

    facts = sess.facts
    doc: dict[str, Any] = {
        "schema": results.SCHEMA_VERSION,
        "kind": "bench",
        "backend": opts.backend if opts.backend != "release" else (names[0] if len(names) == 1 else "engines"),
        "engines": [{"engine": r.engine, "release": r.id, "recipe": r.manifest.get("recipe"),
                     "sources": r.manifest.get("sources"),
                     "spec_type": r.manifest.get("spec_type"), "drafter": bool(r.manifest.get("drafter")),
                     "server_args": r.manifest.get("server_args") or []} for r in rels or []],
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "edgekit_version": __version__,
        "board": {"name": sess.name, "profile": sess.board.profile, "sim": sess.board.sim,
                  "model": facts.model if facts else None, "l4t": facts.l4t if facts else None,
                  "jetpack": facts.jetpack if facts else None, "cuda": facts.cuda if facts else None,
                  "arch": facts.arch if facts else None, "mem_total_mb": facts.mem_total_mb if facts else None,
                  "nvpmodel": ((sess.snapshots.get("before") or {}).get("nvpmodel")),
                  "clocks_locked": (sess.snapshots.get("before") or {}).get("clocks_locked")},
        "profile": {"name": profile.name, "mem_bandwidth_gbs": profile.mem_bandwidth_gbs,
                    "total_power_rail": profile.total_power_rail, "cpu_cores": profile.cpu_cores,
                    "cuda_arch": profile.cuda_arch},
        "release": {"id": sess.release, "recipe": sess.manifest.get("recipe"),
                    "spec_type": sess.manifest.get("spec_type"), "drafter": bool(sess.manifest.get("drafter")),
                    "server_args": sess.release_args, "build": sess.manifest.get("build") or {}},
        "llama_cpp": {"ref": _llama_ref(llama_bench, sess), "build_key": (sess.manifest.get("build") or {}).get("key")},
        "recipe": {"name": sess.recipe.name, "description": sess.recipe.description,
                   "runtime": sess.recipe.runtime.model_dump(mode="json"),
                   "bench": sess.recipe.bench.model_dump(mode="json")},
        "settings": {**plan.to_json(), "quick": opts.quick, "ignore_eos": opts.ignore_eos,
                     "raw_prompts": sess.opts.raw_prompts,
                     "order": [c.name for c in configs], "exclusive": sess.opts.exclusive,
                     "sampler_hz": sess.opts.hz if sess.opts.power else None,
                     "prompt_set": sess.recipe.bench.prompt_set, "bench_port": sess.bench_port},
        "configurations": [c.to_json() for c in configs],
        "service": {"before": sess.service_before.to_json() if sess.service_before else None,
                    "after": sess.service_after.to_json() if sess.service_after else None},
        "power": power,
        "llama_bench": llama_bench,
        "runs": run_docs,
        "summary": {"points": summary, "speedups": ups, "headline": head,
                    **({"engines": table} if table is not None else _drafter_map(measured, names)),
                    **({"sampling": sampled} if table is None and (sampled := results.by_temperature(summary, ups))
                       else {})},
        "roofline": (roofline.roofline(gguf, profile.mem_bandwidth_gbs, decode(base_pt), decode(spec_pt))
                     if gguf is not None else None),  # the GGUF's bytes: llama.cpp's backend only
        "phases": [p.to_json() for p in sess.phases],
        "power_trace": log.trace(0.0) if available else [],  # type: ignore[union-attr]
        "board_state": sess.snapshots,
        "heat": {"throttled_runs": throttled, "left_out": len(run_docs) - len(measured),
                 "keep_throttled": opts.keep_throttled, "throttle_points_c": trips},
        "notes": plan.notes + sess.cleanup_errors + ([heat_note] if heat_note else []),
    }
    if sess.media_runs:
        doc["media"] = {"method": "one image (64×64 PNG) and one second of 16 kHz audio per configuration and "
                                  "repetition, greedy /v1/chat/completions on the warm server after its text runs",
                        "probes": sess.media_runs, "summary": results.summarize_media(sess.media_runs)}
    return doc


def _drafter_map(measured: list[dict[str, Any]], names: list[str]) -> dict[str, Any]:
    """Where the drafter wins; where the engine can serve a request without drafting, the categories to send so."""
    rows = results.drafter_map(measured)
    off = get_engine(names[0]).draft_off_request if names else None
    return {"drafter_map": rows,
            **({"drafting_off": {"request": off, "categories": results.drafting_off(rows)}} if off else {})}


def _llama_ref(llama_bench: list[dict[str, Any]], sess: Session) -> str | None:
    for lb in llama_bench:
        if lb.get("build_commit"):
            return f"{lb['build_commit']} (build {lb.get('build_number')})"
    return (sess.manifest.get("build") or {}).get("ref")


def write(doc: dict[str, Any], out_dir: Path, with_plots: bool = True) -> dict[str, str]:
    """results.json, report.md and the PNGs into ``out_dir``; returns what was written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    files = {"results": "results.json", "report": "report.md"}
    raw = doc.pop("_power_samples", "")
    if raw:
        (out_dir / "power.jsonl").write_text(raw)
        files["power_samples"] = "power.jsonl"
    if with_plots and plots.available():
        for name in plots.write_all(doc, out_dir):
            files[name.removesuffix(".png")] = name
    elif with_plots:  # the numbers matter more than the pictures: never lose a bench over them
        command = optional.install_command(optional.extra(None, only={"matplotlib"}).requirements)
        doc.setdefault("notes", []).append(f"plots skipped: matplotlib is not installed ({command})")
    doc["files"] = files
    (out_dir / "results.json").write_text(json.dumps(doc, indent=1) + "\n")
    (out_dir / "report.md").write_text(report.render(doc))
    return {k: str(out_dir / v) for k, v in files.items()}
