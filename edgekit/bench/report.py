"""The Markdown report of a results document: the headline first, then the tables behind it."""

from __future__ import annotations

import json
from typing import Any

from edgekit.bench.results import point_key
from edgekit.bench.workloads import temperature_label
from edgekit.engines import find_engine
from edgekit.release.manifest import ReleaseManifest

DEFAULT_ENGINE = ReleaseManifest.model_fields["engine"].default  # releases before engines were pluggable


def _e(e: dict[str, Any] | None, digits: int = 1, unit: str = "") -> str:
    if not e:
        return "–"
    ci = e.get("ci95")
    return f"{e['mean']:.{digits}f}{unit}" + (f" ± {ci:.{digits}f}" if ci is not None else "")


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{x:.0%}"


def _num(x: Any, digits: int = 2) -> str:
    return "–" if x is None else f"{x:.{digits}f}"


def _table(head: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(head) + " |", "|" + "|".join(" --- " for _ in head) + "|",
            *("| " + " | ".join(r) + " |" for r in rows), ""]


def _engine_of(doc: dict[str, Any]) -> str:
    """The engine of a single-engine bench (a document made before engines were pluggable: the default's)."""
    engines = doc.get("engines") or []
    return engines[0]["engine"] if engines else DEFAULT_ENGINE


def _what(doc: dict[str, Any], rel: dict[str, Any]) -> str:
    """What ran: an engine's model measured without a release, several engines' releases, or the deployed
    release."""
    model_engine = find_engine(doc.get("backend"))
    what = model_engine.report_what(doc) if model_engine and model_engine.benches_model else None
    if what:
        return what
    engines = doc.get("engines") or []
    if len(engines) > 1:
        return "Releases " + ", ".join(f"`{e['release']}` ({e['engine']})" for e in engines) + " · "
    engine = _engine_of(doc)
    found = find_engine(engine)
    return f"Release `{rel['id']}` · {found.report_ref(doc) if found else engine} · "


def _engines(doc: dict[str, Any]) -> list[str]:
    """Several engines side by side: each with and without its own drafter."""
    s = doc["summary"]
    if not s.get("engines"):
        return []
    # A release per engine: when they hold different models, the table compares models too. (Releases made
    # before release.json had `sources` are told apart by their recipe.)
    models = {e["engine"]: (" + ".join(f"`{e['sources'][r]}`" for r in ("target", "drafter") if r in e["sources"])
                            if e.get("sources")
                            else f"recipe `{e.get('recipe') or '?'}`") for e in doc.get("engines") or []}
    mixed = (["The engines serve different models (" + "; ".join(f"{e}: {m}" for e, m in models.items()) +
              "): each row compares an engine and its models together, not the engine alone.", ""]
             if len(set(models.values())) > 1 else [])
    return ["## Engines side by side", "",
            "Each engine serves its own release of the recipe's models; every repetition runs every engine "
            "in turn on the same prompts, under the same power method and idle baseline.", "", *mixed,
            *_table(["engine", "conc.", "ctx", "tok/s (drafter)", "tok/s (baseline)", "speedup", "acceptance",
                     "TTFT p50 s (drafter / baseline)", "J/token (drafter / baseline)"],
                    [[r["engine"], str(r["concurrency"]), _ctx(r),
                      _num(r["tokens_per_second"], 1), _num(r["baseline_tokens_per_second"], 1),
                      _num(r["speedup"], 2) + ("×" if r["speedup"] is not None else ""), _pct(r["acceptance"]),
                      f"{_num(r['ttft_p50_s'], 3)} / {_num(r['baseline_ttft_p50_s'], 3)}",
                      f"{_num(r['joules_per_token'], 4)} / {_num(r['baseline_joules_per_token'], 4)}"]
                     for r in s["engines"]])]


def _ctx(r: dict[str, Any]) -> str:
    """A row's context length, and its sampling temperature where it was not greedy."""
    return str(r["context_length"] or "–") + temperature_label(r.get("temperature"))


def _drafter_map(rows: list[dict[str, Any]]) -> list[str]:
    """Categories down, load points across: the drafter's ratio and whether it wins there."""
    if not rows:
        return []
    points = list(dict.fromkeys(point_key(r) for r in rows))
    cats = list(dict.fromkeys(r["category"] for r in rows))
    cell = {(r["category"], point_key(r)): r for r in rows}
    mark = {"wins": "**wins**", "loses": "loses", "tie": "tie", "unknown": "?"}

    def text(r: dict[str, Any] | None) -> str:
        return "–" if r is None else f"{r['speedup']['mean']:.2f}× {mark[r['verdict']]}"

    return ["## Where the drafter wins", "",
            "Drafter ÷ baseline per repetition pair: over all requests, tok/s; per prompt category, each request's "
            "decode tok/s. **wins**: its CI95 lies above 1×; loses: below; tie: it spans 1×.", "",
            *_table(["category", *(f"c={c}" + (f" ctx={x}" if len({p[1] for p in points}) > 1 else "")
                                   + temperature_label(t) for c, x, t in points)],
                    [[cat, *(text(cell.get((cat, k))) for k in points)] for cat in cats])]


def _sampling(rows: list[dict[str, Any]]) -> list[str]:
    """Greedy and sampled load side by side: what a client's temperature does to acceptance and the speedup."""
    if not rows:
        return []
    temps = list(dict.fromkeys(r["temperature"] for r in rows))
    where = list(dict.fromkeys((r["concurrency"], r["context_length"]) for r in rows))
    cell = {point_key(r): r for r in rows}

    def text(r: dict[str, Any] | None) -> str:
        return "–" if r is None else f"{_e(r['speedup'], 2, '×')} · {_pct(r['acceptance'])}"

    return ["## Greedy and sampled", "",
            "The same prompts at each temperature, each request seeded alike with and without the drafter; "
            "above 0 the engine's default sampler (llama-server's: top-k 40, top-p 0.95, min-p 0.05). "
            "Speedup (tok/s ratio) · acceptance.", "",
            *_table(["conc.", "ctx", *(f"T={t:g}" for t in temps)],
                    [[str(c), str(x or "–"), *(text(cell.get((c, x, t))) for t in temps)] for c, x in where])]


def _drafting_off(off: dict[str, Any] | None) -> list[str]:
    """The categories a client sends without drafting, and the request that does it."""
    if not off:
        return []
    body = json.dumps(off["request"])
    if not off["categories"]:
        return ["", f"No prompt category loses with the drafter: no request needs `{body}`."]

    def where(points: list[dict[str, Any]]) -> str:
        return ", ".join(f"c={p['concurrency']}" + (f" ctx={p['context_length']}" if p["context_length"] else "")
                         + temperature_label(p.get("temperature")) for p in points)

    return ["", f"Send these with drafting off (`{body}` in the request's body; the other requests keep it):", "",
            *(f"- {c['category']} (the drafter loses at {where(c['loses_at'])})" for c in off["categories"])]


def render(doc: dict[str, Any]) -> str:
    b, rel, s, pw = doc["board"], doc["release"], doc["summary"], doc["power"]
    st = doc["settings"]
    lines = [f"# {doc['recipe']['name']} on {b['name']} ({doc['profile']['name']})", "",
             f"**{s['headline']['text']}**", "",
             _what(doc, rel) +
             f"{b.get('model') or 'board'} · L4T {b.get('l4t') or '?'} · nvpmodel "
             f"{(b.get('nvpmodel') or {}).get('name') or '?'}"
             + {True: " · clocks locked (jetson_clocks)", False: " · clocks not locked"}.get(b.get("clocks_locked"), "")
             + (" · simulated board" if b.get("sim") else ""), "",
             f"{st['repetitions']} repetitions per point, configurations alternated "
             f"({' '.join(st['order'])} …), {st['warmup']} warm-up round(s) per run, n_gen {st['n_gen']}, "
             f"cool-down below {st['cooldown_temp_c']} °C" if st.get("cooldown_temp_c") is not None else
             f"{st['repetitions']} repetitions per point, configurations alternated ({' '.join(st['order'])} …), "
             f"{st['warmup']} warm-up round(s) per run, n_gen {st['n_gen']}, no cool-down.", "",
             "Values are means ± CI95 (Student's t over repetitions). Prompts: " +
             ("as written (`--raw-prompts`)." if st.get("raw_prompts") else
              "through the model's chat template where it has one."), ""]
    lines += _engines(doc)
    if s["speedups"]:
        lines += ["## The drafter's speedup", ""]
        lines += _table(["engine", "concurrency", "context", "speedup (tok/s ratio)", "decode alone",
                         "energy/token ratio"],
                        [[u.get("engine") or _engine_of(doc),
                          str(u["concurrency"]), _ctx(u), _e(u["speedup"], 2, "×"), _e(u.get("decode_speedup"), 2, "×"),
                          _e(u["energy_ratio"], 2, "×")] for u in s["speedups"]])
        lines += ["", "tok/s: every generated token over the run's window (the prompts' processing included); "
                  "decode alone: each request's tokens after its first over their time. At a long context the "
                  "prompt fills the window alike with and without the drafter, and the first ratio drifts to 1×.", ""]
    lines += _sampling(s.get("sampling") or [])
    lines += _drafter_map(s.get("drafter_map") or [])
    lines += _drafting_off(s.get("drafting_off"))
    lines += ["## Throughput, latency, acceptance, energy", ""]
    lines += _table(
        ["config", "conc.", "ctx", "prompt tok", "tok/s", "decode tok/s per request", "TTFT p50 s",
         "latency p95 s", "acceptance", "J/token", "W"],
        [[p["config"], str(p["concurrency"]), _ctx(p), _num(p.get("prompt_tokens_mean"), 0),
          _e(p["tokens_per_second"]), _e(p["decode_tokens_per_second"]), _e(p["ttft_p50_s"], 3),
          _e(p["latency_p95_s"], 3), _pct(p["acceptance"]), _e(p["joules_per_token"], 4), _e(p["average_watts"], 2)]
         for p in s["points"]])
    cats = sorted({c for p in s["points"] for c in (p["acceptance_by_category"] or {})})
    spec = [p for p in s["points"] if not p["config"].endswith("baseline")]
    if cats and spec:
        lines += ["### Acceptance by prompt category", ""]
        lines += _table(["config", "conc.", "ctx", *cats],
                        [[p["config"], str(p["concurrency"]), _ctx(p),
                          *(_pct((p["acceptance_by_category"].get(c) or {}).get("acceptance")) for c in cats)]
                         for p in spec])
    if doc.get("media"):
        lines += ["## Vision and audio", "", doc["media"]["method"] + ".", ""]
        lines += _table(["config", "input", "TTFT (ms)", "tok/s after", "prompt tokens", "acceptance", "failed"],
                        [[m["config"], m["kind"], _num(m["ttft_ms"], 1), _num(m["tokens_per_second"], 1),
                          _num(m["prompt_tokens"], 0), _pct(m["acceptance"]), str(m["failed"])]
                         for m in doc["media"]["summary"]])
    lines += ["## Power", ""]
    if pw.get("available"):
        lines += [f"Source **{pw['source']}**, total = **{pw['total_rail_method']}** ({pw.get('total_rail_note')}); "
                  f"sampled at {pw['sampling_rate_hz']} Hz (asked {pw.get('sampler_hz')} Hz, longest gap "
                  f"{pw['max_gap_s']} s). Idle baseline **{_num(pw['static_power_baseline_watts'], 3)} W**. "
                  f"Energy is integrated from the raw samples over each run's exact window (board monotonic "
                  f"clock); {pw['total_energy_joules']:.3f} J over all measured windows. Per-rail energy is "
                  "in results.json (`runs[].power.rails_energy_joules`).", ""]
        hot = (doc.get("heat") or {}).get("throttled_runs")
        if hot:
            lines += [f"{hot} of {len(doc['runs'])} runs throttled (a thermal zone past its trip point, or a clock "
                      "cap lowered): " + ("kept in the summary." if doc["heat"]["keep_throttled"] or
                                          not doc["heat"]["left_out"] else
                                          f"{doc['heat']['left_out']} left out of the summary (`runs[].throttled`)."),
                      ""]
        longer = [r for r in doc["runs"] if r.get("lengthened")]
        if longer:
            lines += [f"{len(longer)} of {len(doc['runs'])} runs were run again with more requests: their first "
                      "window was too short to hold 20 power samples (`runs[].lengthened`).", ""]
    else:
        lines += [f"Power unavailable: {pw.get('reason')}. Throughput and acceptance are still measured.", ""]
    if doc.get("llama_bench"):
        lines += ["## llama-bench (target alone)", ""]
        lines += _table(["test", "tokens", "tok/s", "W (window)", "J/token (est.)"],
                        [[lb.get("test", "?"), str(lb.get("n_prompt") or lb.get("n_gen") or "–"),
                          _num(lb.get("avg_ts"), 1) + (f" ± {lb['stddev_ts']:.1f}" if lb.get("stddev_ts") else ""),
                          _num((lb.get("power") or {}).get("average_watts"), 2),
                          _num((lb.get("power") or {}).get("joules_per_token_estimate"), 5)]
                         for lb in doc["llama_bench"] if "error" not in lb])
    lines += _roofline(doc.get("roofline") or {})
    plots = {k: v for k, v in (doc.get("files") or {}).items() if v.endswith(".png")}
    if plots:
        lines += ["## Plots", ""] + [f"![{k}]({v})" for k, v in plots.items()] + [""]
    if doc.get("notes"):
        lines += ["## Notes", ""] + [f"- {n}" for n in doc["notes"]] + [""]
    return "\n".join(lines)


def _roofline(rf: dict[str, Any]) -> list[str]:
    """The decode ceiling and how close the board came, with how the bytes were counted (an MoE: its routed
    experts only; a tied head read in full)."""
    if not rf.get("ceiling_tokens_per_second"):
        return []
    counted = f" ({'; '.join(rf['notes'])})" if rf.get("notes") else ""
    return ["## Roofline", "",
            f"{rf['bytes_per_token'] / 1e6:.1f} MB read per token{counted} at {rf['mem_bandwidth_gbs']} GB/s: a "
            f"decode ceiling of **{rf['ceiling_tokens_per_second']:.1f} tok/s** for one stream. Measured without the "
            f"drafter: {_num(rf.get('measured_tokens_per_second'), 1)} tok/s "
            f"({_pct(rf.get('measured_fraction'))} of the ceiling)"
            + (f"; with it {_num(rf.get('drafter_tokens_per_second'), 1)} tok/s "
               f"({_pct(rf.get('drafter_fraction'))}, drafting can pass the ceiling)"
               if rf.get("drafter_tokens_per_second") else "") + ".", ""]
