"""From runs to results: per-point estimates, the drafter's speedup, the headline, the document.

Repetitions of a point are independent runs on a freshly started server, alternated between
configurations (A B A B …), so the speedup is estimated per repetition pair (drafter / baseline
of the same repetition) and its CI95 comes from those ratios.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from edgekit.bench.stats import Estimate, estimate
from edgekit.resources import results_schema_file

SCHEMA_ID = "https://edgekit.dev/schemas/bench-results-1.json"
SCHEMA_VERSION = "edgekit-bench/1"
SCHEMA_FILE = results_schema_file()


def _est(values: Iterable[float | None]) -> dict[str, Any] | None:
    e = estimate([v for v in values if v is not None])
    return e.to_json() if e else None


def _pooled_acceptance(runs: list[dict[str, Any]]) -> tuple[float | None, dict[str, dict[str, Any]]]:
    n = sum(r.get("draft_n") or 0 for r in runs)
    a = sum(r.get("draft_n_accepted") or 0 for r in runs)
    cats: dict[str, dict[str, Any]] = {}
    for r in runs:
        for cat, v in (r.get("acceptance_by_category") or {}).items():
            c = cats.setdefault(cat, {"draft_n": 0, "draft_n_accepted": 0})
            c["draft_n"] += v.get("draft_n") or 0
            c["draft_n_accepted"] += v.get("draft_n_accepted") or 0
    for c in cats.values():
        c["acceptance"] = c["draft_n_accepted"] / c["draft_n"] if c["draft_n"] else None
    return (a / n if n else None), cats


def _power(r: dict[str, Any], key: str) -> float | None:
    p = r.get("power") or {}
    return p.get(key) if p.get("available") else None


Key = tuple[int, "int | None", float]  # a load point: (concurrency, context length, temperature)


def point_key(r: dict[str, Any]) -> Key:
    """A run's (or an entry's) load point; runs from before sampling have no temperature: greedy."""
    return int(r["concurrency"]), r["context_length"] or None, float(r.get("temperature") or 0.0)


def _order(k: Key) -> tuple[float, int, int]:
    """Greedy first, then by context length, then by concurrency."""
    return k[2], k[1] or 0, k[0]


def points_of(rows: Iterable[dict[str, Any]]) -> list[Key]:
    return sorted({point_key(r) for r in rows}, key=_order)


def at_point(k: Key) -> dict[str, Any]:
    c, ctx, t = k
    return {"concurrency": c, "context_length": ctx, "temperature": t}


def summarize(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per (config, load point): estimates over its repetitions."""
    keys = sorted({(r["config"], point_key(r)) for r in runs}, key=lambda k: (_order(k[1]), k[0]))
    out = []
    for cfg, k in keys:
        rs = [r for r in runs if (r["config"], point_key(r)) == (cfg, k)]
        acc, by_cat = _pooled_acceptance(rs)
        out.append({
            "config": cfg, **at_point(k), "repetitions": len(rs),
            "tokens_per_second": _est(r["tokens_per_second"] for r in rs),
            "decode_tokens_per_second": _est(r["decode_tokens_per_second_mean"] for r in rs),
            "ttft_p50_s": _est(r["ttft_p50_s"] for r in rs), "latency_p95_s": _est(r["latency_p95_s"] for r in rs),
            "acceptance": acc, "acceptance_by_category": by_cat,
            "joules_per_token": _est(_power(r, "joules_per_token") for r in rs),
            "dynamic_joules_per_token": _est(_power(r, "dynamic_joules_per_token") for r in rs),
            "average_watts": _est(_power(r, "average_watts") for r in rs),
            "prompt_tokens_mean": rs[0].get("prompt_tokens_mean"),
        })
    return out


def _paired(runs: list[dict[str, Any]], a: str, b: str, k: Key, key: str, power: bool = False) -> Estimate | None:
    def value(r: dict[str, Any]) -> float | None:
        return _power(r, key) if power else r.get(key)

    by_rep: dict[int, dict[str, float | None]] = {}
    for r in runs:
        if point_key(r) == k and r["config"] in (a, b):
            by_rep.setdefault(r["repetition"], {})[r["config"]] = value(r)
    ratios = [v[a] / v[b] for v in by_rep.values() if v.get(a) and v.get(b)]
    return estimate(ratios)


def summarize_media(probes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per configuration and kind (image, audio): median time to first token (the media encoded and the prompt
    read, llama-server's prompt_ms), median decode tok/s after it, and the drafts' acceptance."""
    import statistics

    out = []
    for key in sorted({(p["config"], p["kind"]) for p in probes}):
        group = [p for p in probes if (p["config"], p["kind"]) == key]
        good = [p for p in group if p["ok"]]

        def median(field: str, rows: list[dict[str, Any]] = good) -> float | None:
            vals = [float(r[field]) for r in rows if r.get(field) is not None]
            return round(statistics.median(vals), 3) if vals else None

        drafted = sum(int(p.get("draft_n") or 0) for p in good)
        out.append({"config": key[0], "kind": key[1], "probes": len(group), "failed": len(group) - len(good),
                    "ttft_ms": median("ttft_ms"), "tokens_per_second": median("tokens_per_second"),
                    "prompt_tokens": median("prompt_tokens"),
                    "acceptance": round(sum(int(p.get("draft_n_accepted") or 0) for p in good) / drafted, 4)
                    if drafted else None})
    return out


def speedups(runs: list[dict[str, Any]], spec: str = "drafter", base: str = "baseline") -> list[dict[str, Any]]:
    """Per point: drafter tok/s ÷ baseline tok/s (the run's window: prompts and decode), the same for decode
    alone, and drafter J/token ÷ baseline J/token (each paired per repetition)."""
    out = []
    for k in points_of(runs):
        s = _paired(runs, spec, base, k, "tokens_per_second")
        if s is None:
            continue
        e = _paired(runs, spec, base, k, "joules_per_token", power=True)
        # Decode alone (each request's tokens after its first ÷ their time): at a long context the window's
        # ratio also holds the prompt's processing, the same with and without the drafter, and drifts to 1×.
        d = _paired(runs, spec, base, k, "decode_tokens_per_second_mean")
        out.append({**at_point(k), "speedup": s.to_json(), "energy_ratio": e.to_json() if e else None,
                    "decode_speedup": d.to_json() if d else None})
    return out


def _verdict(e: Estimate | None) -> str:
    if e is None or e.low is None or e.high is None:
        return "unknown"
    return "wins" if e.low > 1.0 else "loses" if e.high < 1.0 else "tie"


def _category_tps(run: dict[str, Any], category: str) -> float | None:
    """A run's mean decode tok/s over its requests of one prompt category (what a user of that task sees)."""
    vals = [r["decode_tps"] for r in run.get("requests_detail") or []
            if r.get("category") == category and "error" not in r and r.get("decode_tps")]
    return sum(vals) / len(vals) if vals else None


def drafter_map(runs: list[dict[str, Any]], spec: str = "drafter", base: str = "baseline") -> list[dict[str, Any]]:
    """Where the drafter wins: per point, over all requests (tok/s) and per prompt category (each request's
    decode tok/s), the paired drafter ÷ baseline ratio and its verdict (wins: CI95 above 1; loses: below; tie)."""
    cats = sorted({q["category"] for r in runs for q in r.get("requests_detail") or [] if q.get("category")})
    out = []
    for k in points_of(r for r in runs if r["config"] == spec):
        overall = _paired(runs, spec, base, k, "tokens_per_second")
        if overall is None:
            continue
        out.append({"category": "all", **at_point(k), "speedup": overall.to_json(), "verdict": _verdict(overall)})
        for cat in cats:
            by_rep: dict[int, dict[str, float | None]] = {}
            for r in runs:
                if point_key(r) == k and r["config"] in (spec, base):
                    by_rep.setdefault(r["repetition"], {})[r["config"]] = _category_tps(r, cat)
            e = estimate([v[spec] / v[base] for v in by_rep.values() if v.get(spec) and v.get(base)])
            if e is not None:
                out.append({"category": cat, **at_point(k), "speedup": e.to_json(), "verdict": _verdict(e)})
    return out


def drafting_off(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """From a drafter map: the prompt categories the drafter loses on, with the load points where it does (a
    client sends those requests with drafting off, where its engine takes that per request)."""
    out: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        if r["category"] != "all" and r["verdict"] == "loses":
            out.setdefault(r["category"], []).append(at_point(point_key(r)))
    return [{"category": cat, "loses_at": points} for cat, points in sorted(out.items())]


def engine_speedups(runs: list[dict[str, Any]], engines: list[str]) -> list[dict[str, Any]]:
    """Each engine's drafter ÷ its own baseline (configs ``<engine>/drafter`` and ``<engine>/baseline``)."""
    return [{**u, "engine": e} for e in engines for u in speedups(runs, f"{e}/drafter", f"{e}/baseline")]


def engines_table(summary: list[dict[str, Any]], ups: list[dict[str, Any]], engines: list[str]) -> list[dict[str, Any]]:
    """One row per engine and point: with and without its drafter side by side."""
    def at(cfg: str, k: Key) -> dict[str, Any]:
        return next((p for p in summary if p["config"] == cfg and point_key(p) == k), {})

    def mean(p: dict[str, Any], key: str) -> float | None:
        return (p.get(key) or {}).get("mean")

    rows = []
    for k in points_of(summary):
        for e in engines:
            d, b = at(f"{e}/drafter", k), at(f"{e}/baseline", k)
            if not d and not b:
                continue
            up = next((u for u in ups if u["engine"] == e and point_key(u) == k), {})
            rows.append({"engine": e, **at_point(k),
                         "tokens_per_second": mean(d, "tokens_per_second"),
                         "baseline_tokens_per_second": mean(b, "tokens_per_second"),
                         "speedup": (up.get("speedup") or {}).get("mean"), "acceptance": d.get("acceptance"),
                         "ttft_p50_s": mean(d, "ttft_p50_s"), "baseline_ttft_p50_s": mean(b, "ttft_p50_s"),
                         "joules_per_token": mean(d, "joules_per_token"),
                         "baseline_joules_per_token": mean(b, "joules_per_token")})
    return rows


def engines_headline(table: list[dict[str, Any]], ups: list[dict[str, Any]]) -> dict[str, Any]:
    """The engines at the first point (fewest requests, shortest prompts), fastest first."""
    if not table:
        return {"text": "No engine produced a measurement.", "speedup": None}
    first = point_key(table[0])
    rows = [r for r in table if point_key(r) == first]
    rows.sort(key=lambda r: -(r["tokens_per_second"] or r["baseline_tokens_per_second"] or 0))

    def part(r: dict[str, Any]) -> str:
        if r["tokens_per_second"] is None:
            return f"{r['engine']} {r['baseline_tokens_per_second'] or 0:.1f} tok/s (no drafter)"
        acc = f", {r['acceptance']:.0%} accepted" if r["acceptance"] is not None else ""
        up = f"{r['speedup']:.2f}× its baseline" if r["speedup"] is not None else "unpaired"
        return f"{r['engine']} {r['tokens_per_second']:.1f} tok/s with its drafter ({up}{acc})"

    c, ctx, _t = first
    where = f"{c} request{'s' if c > 1 else ''} at a time" + (f", {ctx}-token prompts" if ctx else "")
    best = next((u for u in ups if u["engine"] == rows[0]["engine"] and point_key(u) == first), None)
    return {"text": f"At {where}: " + "; ".join(part(r) for r in rows) + ".",
            "speedup": best["speedup"] if best else None, "concurrency": c, "context_length": ctx,
            "fastest": rows[0]["engine"]}


def _fmt_ci(e: dict[str, Any] | None, unit: str = "×", digits: int = 2) -> str:
    if not e:
        return "n/a"
    ci = e.get("ci95")
    body = f"{e['mean']:.{digits}f}{unit}"
    return body + (f" (CI95 ±{ci:.{digits}f})" if ci is not None else f" (n = {e['n']})")


def headline(summary: list[dict[str, Any]], ups: list[dict[str, Any]], model: str) -> dict[str, Any]:
    """The sentence a reader takes away: the drafter's speedup at one request, how it moves with load, and at
    each other sampling temperature measured."""
    if not ups:
        has_spec = any(p["config"] == "drafter" for p in summary)
        text = ("No drafter speedup: the release has no speculative decoding to compare." if not has_spec
                else "No drafter speedup: the runs could not be paired.")
        return {"text": text, "speedup": None}
    first = ups[0]
    s = first["speedup"]
    where = f"{first['concurrency']} request{'s' if first['concurrency'] > 1 else ''} at a time"
    if first["context_length"]:
        where += f", {first['context_length']}-token prompts"
    if first.get("temperature"):
        where += f", temperature {first['temperature']:g}"
    text = f"The drafter makes {model} {_fmt_ci(s)} as fast as without it ({where})"
    same_t = [u for u in ups if u.get("temperature") == first.get("temperature")]
    last = same_t[-1] if len(same_t) > 1 else None
    if last is not None:
        text += (f"; at {last['concurrency']} requests, {last['context_length'] or '-'} tokens: "
                 f"{_fmt_ci(last['speedup'])}")
    e = first.get("energy_ratio")
    if e:
        text += f". Energy per token: {_fmt_ci(e)} of the baseline's"

    def accepted(k: Key) -> float | None:
        return next((p["acceptance"] for p in summary if p["config"] == "drafter" and point_key(p) == k), None)

    acc = accepted(point_key(first))
    if acc is not None:
        text += f"; {acc:.0%} of drafted tokens accepted"
    for u in ups:  # the same load point sampled: what a client at that temperature gets
        if point_key(u)[:2] == point_key(first)[:2] and u.get("temperature") != first.get("temperature"):
            a = accepted(point_key(u))
            text += (f". At temperature {u['temperature']:g}: {_fmt_ci(u['speedup'])}"
                     + (f", {a:.0%} accepted" if a is not None else ""))
    return {"text": text + ".", "speedup": s, "concurrency": first["concurrency"],
            "context_length": first["context_length"], "temperature": first.get("temperature", 0.0),
            "energy_ratio": e, "acceptance": acc}


def by_temperature(summary: list[dict[str, Any]], ups: list[dict[str, Any]], spec: str = "drafter"
                   ) -> list[dict[str, Any]]:
    """Acceptance and the drafter's speedup at each temperature, side by side per (concurrency, context length);
    empty when the bench sampled at one temperature only."""
    keys = points_of(ups)
    if len({k[2] for k in keys}) < 2:
        return []
    rows = []
    for k in sorted(keys, key=lambda k: (k[1] or 0, k[0], k[2])):
        u = next(u for u in ups if point_key(u) == k)
        p = next((p for p in summary if p["config"] == spec and point_key(p) == k), {})
        rows.append({**at_point(k), "speedup": u["speedup"], "acceptance": p.get("acceptance")})
    return rows


def schema() -> dict[str, Any]:
    return json.loads(SCHEMA_FILE.read_text())


def validate(doc: dict[str, Any]) -> None:
    """Raise jsonschema.ValidationError when ``doc`` does not follow edgekit/data/results-schema.json."""
    import jsonschema

    jsonschema.validate(doc, schema())
