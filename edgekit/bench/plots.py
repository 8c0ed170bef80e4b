"""PNG plots of a results document (matplotlib, Agg: no display needed).

    tps_vs_concurrency.png      tok/s vs concurrency, with and without the drafter (each repetition; CI95 from 3)
    acceptance_by_category.png  drafted tokens accepted, per prompt category
    power_trace.png             total power over the bench, phases shaded, idle baseline drawn
    joules_per_token.png        J/token per point and configuration (each repetition; CI95 from 3)
    drafter_wins.png            the drafter's ratio per prompt category and load point: where it wins, loses
    speedup_vs_context.png      the drafter's speedup against the prompt's length, one line per concurrency
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from edgekit.bench.results import point_key, points_of
from edgekit.bench.workloads import temperature_label

COLORS = {"drafter": "#1f77b4", "baseline": "#ff7f0e"}
PHASE_COLORS = {"idle": "#cccccc", "llama-bench": "#c5b0d5"}


def available() -> bool:
    return importlib.util.find_spec("matplotlib") is not None


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")  # files only, never a window
    import matplotlib.pyplot as plt

    return plt


def _save(plt: Any, fig: Any, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _color(name: str, k: int) -> str:
    """Several engines (``<engine>/<config>``): one colour per engine (its class's ``color``), the baseline
    told by its marker."""
    from edgekit.engines import find_engine

    engine, sep, _ = name.partition("/")
    if sep:
        found = find_engine(engine)
        return found.color if found else f"C{k + 2}"
    return COLORS.get(name, f"C{k + 2}")


def _marker(name: str) -> str:
    return "s" if name.endswith("baseline") and "/" in name else "o"


def _empty(ax: Any, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, fontsize=11, color="#555555")
    ax.set_xticks([])
    ax.set_yticks([])


# From two repetitions a Student-t interval is ±12.7 standard deviations (t at one degree of freedom): a bar that
# long says nothing, and reaches below zero. The repetitions themselves are drawn; an interval only from three.
MIN_REPETITIONS_FOR_CI = 3


def error_bars(estimates: list[dict[str, Any]]) -> list[list[float]]:
    """[below, above] for ``ax.errorbar``/``ax.bar``: each estimate's CI95 where it has three or more repetitions
    (none otherwise), the lower arm clipped at zero (tok/s and J/token are never negative)."""
    below, above = [], []
    for e in estimates:
        ci = e.get("ci95") if (e.get("n") or 0) >= MIN_REPETITIONS_FOR_CI else None
        below.append(min(ci, max(e["mean"], 0.0)) if ci else 0.0)
        above.append(ci or 0.0)
    return [below, above]


def _repetitions(ax: Any, xs: list[float], estimates: list[dict[str, Any]], color: str) -> None:
    """Each repetition's own value, as a small dot beside its mean."""
    px = [x for x, e in zip(xs, estimates, strict=True) for _ in e.get("values") or []]
    py = [v for e in estimates for v in e.get("values") or []]
    if px:
        ax.scatter(px, py, s=9, color=color, alpha=0.55, linewidths=0, zorder=3)


def _configs(summary: list[dict[str, Any]]) -> list[str]:
    seen: list[str] = []
    for p in summary:
        if p["config"] not in seen:
            seen.append(p["config"])
    return seen


def tps_vs_concurrency(doc: dict[str, Any], path: Path) -> None:
    plt = _plt()
    summary = doc["summary"]["points"]
    lines = sorted({point_key(p)[1:] for p in summary}, key=lambda k: (k[1], k[0] or 0))  # (ctx, temperature)
    several_ctx = len({ctx for ctx, _ in lines}) > 1
    fig, ax = plt.subplots(figsize=(7, 4.5))
    styles = ["-", "--", ":", "-."]
    for k, cfg in enumerate(_configs(summary)):
        for j, (ctx, temp) in enumerate(lines):
            pts = sorted((p for p in summary if p["config"] == cfg and point_key(p)[1:] == (ctx, temp)
                          and p["tokens_per_second"]), key=lambda p: p["concurrency"])
            if not pts:
                continue
            xs = [p["concurrency"] for p in pts]
            ests = [p["tokens_per_second"] for p in pts]
            ys = [e["mean"] for e in ests]
            label = cfg + (f", ctx {ctx}" if several_ctx else "") + temperature_label(temp)
            ax.errorbar(xs, ys, yerr=error_bars(ests), marker=_marker(cfg), capsize=4,
                        linestyle=styles[j % len(styles)], color=_color(cfg, k), label=label)
            _repetitions(ax, xs, ests, _color(cfg, k))
    ax.set_xscale("log", base=2)
    concs = sorted({p["concurrency"] for p in summary})
    ax.set_xticks(concs)
    ax.set_xticklabels([str(c) for c in concs])
    ax.set_xlabel("concurrent requests")
    ax.set_ylabel("generated tokens / s (all requests)")
    ax.set_title(f"{doc['recipe']['name']} on {doc['board']['name']} ({doc['profile']['name']})")
    ax.grid(True, alpha=0.3)
    ax.legend()
    _save(plt, fig, path)


def acceptance_by_category(doc: dict[str, Any], path: Path) -> None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    spec = [p for p in doc["summary"]["points"] if not p["config"].endswith("baseline") and p["acceptance_by_category"]]
    cats: dict[str, list[int]] = {}
    for p in spec:
        for cat, v in p["acceptance_by_category"].items():
            c = cats.setdefault(cat, [0, 0])
            c[0] += v.get("draft_n_accepted") or 0
            c[1] += v.get("draft_n") or 0
    if not cats or not any(n for _, n in cats.values()):
        _empty(ax, "no drafted tokens: no speculative configuration was measured")
    else:
        names = sorted(cats)
        rates = [cats[c][0] / cats[c][1] if cats[c][1] else 0.0 for c in names]
        bars = ax.bar(names, rates, color=COLORS["drafter"])
        for bar, c in zip(bars, names, strict=True):
            ax.annotate(f"{cats[c][0]}/{cats[c][1]}", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                        ha="center", va="bottom", fontsize=8)
        ax.set_ylim(0, max(1.0, max(rates) * 1.15))
        ax.set_ylabel("accepted / drafted tokens")
        ax.set_xlabel("prompt category")
    ax.set_title("Draft acceptance by prompt category")
    _save(plt, fig, path)


def drafter_wins(doc: dict[str, Any], path: Path) -> None:
    """A map of the drafter's ratio: prompt categories × load points, green where it wins, red where it loses."""
    import math

    plt = _plt()
    rows = doc["summary"].get("drafter_map") or []
    points = list(dict.fromkeys(point_key(r) for r in rows))
    cats = list(dict.fromkeys(r["category"] for r in rows))
    fig, ax = plt.subplots(figsize=(max(5.0, 1.3 * len(points) + 2.5), max(3.0, 0.5 * len(cats) + 1.5)))
    if not rows:
        _empty(ax, "no drafter measured beside a baseline")
    else:
        cell = {(r["category"], *point_key(r)): r for r in rows}
        grid = [[math.log2(cell[(c, *p)]["speedup"]["mean"]) if (c, *p) in cell else float("nan") for p in points]
                for c in cats]
        span = max(0.25, max((abs(v) for row in grid for v in row if v == v), default=0.25))
        ax.imshow(grid, cmap="RdYlGn", vmin=-span, vmax=span, aspect="auto")
        for i, c in enumerate(cats):
            for j, p in enumerate(points):
                r = cell.get((c, *p))
                if r:
                    ax.text(j, i, f"{r['speedup']['mean']:.2f}×\n{r['verdict']}", ha="center", va="center",
                            fontsize=8)
        ax.set_xticks(range(len(points)))
        ax.set_xticklabels([f"c={c}" + (f"\nctx {x}" if len({q[1] for q in points}) > 1 else "")
                            + (f"\nT {t:g}" if len({q[2] for q in points}) > 1 else "") for c, x, t in points])
        ax.set_yticks(range(len(cats)))
        ax.set_yticklabels(cats)
        ax.set_xlabel("concurrent requests")
    ax.set_title("Drafter ÷ target alone\n(green: wins, its CI95 above 1×)", fontsize=10)
    _save(plt, fig, path)


def speedup_vs_context(doc: dict[str, Any], path: Path) -> None:
    """The drafter's speedup (paired, per repetition) against context length: where the gain fades."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ups = [u for u in doc["summary"].get("speedups") or [] if u.get("context_length")]
    if len({u["context_length"] for u in ups}) < 2:
        _empty(ax, "one context length measured: bench --context-lengths 128,2048,8192,… draws the gain against it")
    else:
        series = dict.fromkeys((u.get("engine"), u["concurrency"], u.get("temperature") or 0.0) for u in ups)
        for k, (engine, c, temp) in enumerate(series):
            pts = sorted((u for u in ups if (u.get("engine"), u["concurrency"], u.get("temperature") or 0.0)
                          == (engine, c, temp)), key=lambda u: u["context_length"])
            xs, ests = [u["context_length"] for u in pts], [u["speedup"] for u in pts]
            color = f"C{k % 10}"
            name = (f"{engine}, " if engine else "") + f"c={c}" + temperature_label(temp)
            ax.errorbar(xs, [e["mean"] for e in ests], yerr=error_bars(ests), marker="o", capsize=4, color=color,
                        label=f"{name}: tok/s (prompt + decode)")
            _repetitions(ax, xs, ests, color)
            decode = [(u["context_length"], u["decode_speedup"]) for u in pts if u.get("decode_speedup")]
            if decode:  # without the prompt's processing, which both configurations spend alike
                ax.errorbar([x for x, _ in decode], [e["mean"] for _, e in decode],
                            yerr=error_bars([e for _, e in decode]), marker="s", capsize=4, color=color,
                            linestyle="--", label=f"{name}: decode alone")
                _repetitions(ax, [x for x, _ in decode], [e for _, e in decode], color)
        ax.axhline(1.0, color="#888888", ls="--", lw=0.8)
        ax.set_xscale("log", base=2)
        ctxs = sorted({u["context_length"] for u in ups})
        ax.set_xticks(ctxs)
        ax.set_xticklabels([str(x) for x in ctxs])
        ax.set_xlabel("context length (prompt tokens)")
        ax.set_ylabel("drafter tok/s ÷ target alone")
        ax.grid(True, alpha=0.3)
        ax.legend()
    ax.set_title("The drafter's speedup against context length")
    _save(plt, fig, path)


def pareto(doc: dict[str, Any], path: Path) -> None:
    """`bench --power-modes`: tok/s against J/token per mode and configuration, the front joined."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    pts = [p for p in doc["table"] if p["tokens_per_second"] and p["joules_per_token"]]
    if not pts:
        _empty(ax, "no power figures: the front needs J/token")
    else:
        for k, cfg in enumerate(dict.fromkeys(p["config"] for p in pts)):
            mine = [p for p in pts if p["config"] == cfg]
            ax.scatter([p["joules_per_token"] for p in mine], [p["tokens_per_second"] for p in mine],
                       color=_color(cfg, k), label=cfg, zorder=3)
            for p in mine:
                ax.annotate(f"{p['mode_name']} c={p['concurrency']}", (p["joules_per_token"], p["tokens_per_second"]),
                            textcoords="offset points", xytext=(4, 4), fontsize=8)
        front = sorted((p for p in pts if p["front"]), key=lambda p: p["joules_per_token"])
        ax.plot([p["joules_per_token"] for p in front], [p["tokens_per_second"] for p in front], color="#2ca02c",
                linestyle="--", marker="o", markersize=13, markerfacecolor="none", label="front", zorder=2)
        ax.set_xlabel("J/token (lower is better)")
        ax.set_ylabel("tok/s (higher is better)")
        ax.grid(True, alpha=0.3)
        ax.legend()
    ax.set_title(f"{doc['recipe']} on {doc['board']}: power modes")
    _save(plt, fig, path)


def power_trace(doc: dict[str, Any], path: Path) -> None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(9, 4))
    power = doc["power"]
    trace = doc.get("power_trace") or []
    if not power.get("available") or not trace:
        _empty(ax, power.get("reason") or "power unavailable")
    else:
        t0 = trace[0][0]
        ax.plot([t - t0 for t, _ in trace], [w for _, w in trace], lw=0.8, color="#333333", label="total")
        used: set[str] = set()
        for ph in doc.get("phases", []):
            key = ph["config"] or ph["name"].split(" ")[0]
            if ph["name"].startswith("llama-bench"):
                key = "llama-bench"
            color = COLORS.get(key) or PHASE_COLORS.get(key, "#dddddd")
            label = key if key not in used else None
            used.add(key)
            ax.axvspan(ph["start"] - t0, ph["end"] - t0, color=color, alpha=0.25, lw=0, label=label)
        base = power.get("static_power_baseline_watts")
        if base is not None:
            ax.axhline(base, color="#888888", ls="--", lw=0.8, label=f"idle {base:.2f} W")
        ax.set_xlabel("seconds since the sampler started")
        ax.set_ylabel(f"W ({power.get('total_rail_method')})")
        ax.legend(loc="upper right", fontsize=8, ncol=2)
        ax.grid(True, alpha=0.3)
    ax.set_title(f"Board power during the bench ({power.get('sampling_rate_hz') or '-'} Hz)")
    _save(plt, fig, path)


def joules_per_token(doc: dict[str, Any], path: Path) -> None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    summary = [p for p in doc["summary"]["points"] if p.get("joules_per_token")]
    if not summary:
        _empty(ax, doc["power"].get("reason") or "no energy figures")
    else:
        cfgs = _configs(summary)
        pts = points_of(summary)
        width = 0.8 / len(cfgs)
        for k, cfg in enumerate(cfgs):
            xs, ests = [], []
            for i, key in enumerate(pts):
                p = next((q for q in summary if q["config"] == cfg and point_key(q) == key), None)
                if p:
                    xs.append(i + k * width)
                    ests.append(p["joules_per_token"])
            ax.bar(xs, [e["mean"] for e in ests], width, yerr=error_bars(ests), capsize=3, color=_color(cfg, k),
                   label=cfg, hatch="//" if _marker(cfg) == "s" else None)
            _repetitions(ax, xs, ests, "#333333")
        ax.set_xticks([i + width * (len(cfgs) - 1) / 2 for i in range(len(pts))])
        ax.set_xticklabels([f"c={c}\nctx={ctx or '-'}" + (f"\nT={t:g}" if t else "") for c, ctx, t in pts])
        ax.set_ylabel("J / generated token")
        ax.legend()
        ax.grid(True, axis="y", alpha=0.3)
    ax.set_title("Energy per token")
    _save(plt, fig, path)


PLOTS = {
    "tps_vs_concurrency.png": tps_vs_concurrency,
    "acceptance_by_category.png": acceptance_by_category,
    "drafter_wins.png": drafter_wins,
    "speedup_vs_context.png": speedup_vs_context,
    "power_trace.png": power_trace,
    "joules_per_token.png": joules_per_token,
}


def write_all(doc: dict[str, Any], out_dir: Path) -> list[str]:
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, fn in PLOTS.items():
        fn(doc, out_dir / name)
    return list(PLOTS)
