"""Trend plots of the history: one PNG per board, recipe and metric (matplotlib, Agg).

Each line is one configuration at one point (mean per night, bars: min…max of its repetitions).
A dotted vertical line marks a night whose release differs from the night before, a dashed one
a new llama.cpp ref, a solid one the gate's baseline start — the usual suspects for a step.
`trends_markdown` writes the same trends as Mermaid charts, which GitHub renders in a job summary
(it strips inline data: images, so PNGs can only be linked there).
"""

from __future__ import annotations

import re
from collections import defaultdict
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from edgekit import optional
from edgekit.history.metrics import METRICS, point_label
from edgekit.history.store import History

MAX_MERMAID_NIGHTS = 30


def _plt() -> Any:
    try:
        import matplotlib
    except ModuleNotFoundError:
        raise optional.refusal("the history's plots", optional.extra(None, only={"matplotlib"})) from None
    matplotlib.use("Agg")  # files only, never a window
    import matplotlib.pyplot as plt

    return plt


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name)


def _short(text: str | None, n: int = 12) -> str:
    if not text:
        return "?"
    return text if len(text) <= n else text[: n - 1] + "…"


def grouped(history: History, board: str | None = None, metric: str | None = None
            ) -> dict[tuple[str, str, str], list[dict[str, Any]]]:
    """(board, recipe, metric) → that metric's rows (one per night and series), oldest first."""
    out: dict[tuple[str, str, str], list[dict[str, Any]]] = defaultdict(list)
    for row in history.series_rows(board=board, metric=metric):
        out[(row["board"], row["recipe"], row["metric"])].append(row)
    return dict(out)


def _markers(rows: list[dict[str, Any]]) -> list[tuple[float, str, str]]:
    """(time, kind, label) where the release or the llama.cpp ref changes from one night to the next."""
    nights: dict[int, dict[str, Any]] = {}
    for r in rows:
        nights.setdefault(r["run_id"], r)
    out: list[tuple[float, str, str]] = []
    prev: dict[str, Any] | None = None
    for r in sorted(nights.values(), key=lambda r: (r["created_ts"], r["run_id"])):
        if prev is not None and r["llama_ref"] != prev["llama_ref"]:
            out.append((r["created_ts"], "llama", f"llama.cpp {_short(r['llama_ref'])}"))
        elif prev is not None and r["release"] != prev["release"]:
            out.append((r["created_ts"], "release", _short(r["release"], 28)))
        prev = r
    return out


def plot_metric(rows: list[dict[str, Any]], title: str, path: Path, baseline_ts: float | None = None) -> Path:
    plt = _plt()
    spec = METRICS[rows[0]["metric"]]
    fig, ax = plt.subplots(figsize=(9, 4.8), dpi=110)
    by_series: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        by_series[f"{r['config']} {point_label(r['concurrency'], r['context_length'])}"].append(r)
    for k, (label, rs) in enumerate(sorted(by_series.items())):
        x = [datetime.fromtimestamp(r["created_ts"], tz=timezone.utc) for r in rs]
        y = [r["mean"] for r in rs]
        lo = [r["mean"] - min(r["values"]) for r in rs]
        hi = [max(r["values"]) - r["mean"] for r in rs]
        ax.errorbar(x, y, yerr=[lo, hi], marker="o", ms=3.5, lw=1.3, capsize=2, label=label, color=f"C{k % 10}")
    styles = {"release": (":", "#777777"), "llama": ("--", "#b22222")}
    for ts, kind, text in _markers(rows):
        t = datetime.fromtimestamp(ts, tz=timezone.utc)
        ls, color = styles[kind]
        ax.axvline(t, ls=ls, color=color, lw=1)
        # y in axes coordinates: the label stays inside the frame whatever the data range.
        ax.text(t, 0.98, f" {text}", rotation=90, va="top", ha="left", fontsize=7, color=color,
                transform=ax.get_xaxis_transform())
    if baseline_ts is not None:
        t = datetime.fromtimestamp(baseline_ts, tz=timezone.utc)
        ax.axvline(t, color="#2e8b57", lw=1.5)
        ax.text(t, 0.02, " baseline start", rotation=90, va="bottom", ha="left", fontsize=7, color="#2e8b57",
                transform=ax.get_xaxis_transform())
    ax.set_title(title)
    ax.set_ylabel(f"{spec.label} ({'higher' if spec.direction == 'bigger' else 'lower'} is better)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    fig.autofmt_xdate()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


def write_plots(history: History, out_dir: Path, board: str | None = None,
                metric: str | None = None) -> list[Path]:
    """One PNG per (board, recipe, metric) under ``out_dir``; returns the files written."""
    written = []
    for (b, recipe, m), rows in sorted(grouped(history, board, metric).items()):
        start = history.baseline_start(b, recipe)
        name = f"{_safe(b)}-{_safe(recipe)}-{m}.png"
        title = f"{b} · {recipe} · {METRICS[m].label}"
        written.append(plot_metric(rows, title, out_dir / name, start.created_ts if start else None))
    return written


def _mermaid(rows: list[dict[str, Any]], title: str, unit: str) -> list[str]:
    rows = rows[-MAX_MERMAID_NIGHTS:]
    x = ", ".join(f'"{datetime.fromtimestamp(r["created_ts"], tz=timezone.utc):%m-%d}"' for r in rows)
    y = ", ".join(f"{r['mean']:.6g}" for r in rows)
    lo, hi = min(r["mean"] for r in rows), max(r["mean"] for r in rows)
    pad = (hi - lo) * 0.2 or abs(hi) * 0.05 or 1.0
    return ["```mermaid", "xychart-beta", f'    title "{title}"', f"    x-axis [{x}]",
            f'    y-axis "{unit}" {lo - pad:.6g} --> {hi + pad:.6g}', f"    line [{y}]", "```"]


def trends_markdown(history: History, board: str | None = None, images: list[Path] | None = None) -> str:
    """Markdown with one Mermaid trend chart per headline series (first point of each configuration)."""
    out = ["## Benchmark trends", ""]
    groups = grouped(history, board)
    if not groups:
        return "\n".join([*out, "No nights recorded yet.", ""])
    for (b, recipe, m), rows in sorted(groups.items()):
        spec = METRICS[m]
        by_series: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for r in rows:
            by_series[r["series"]].append(r)
        firsts: dict[str, str] = {}
        for series, rs in sorted(by_series.items(), key=lambda kv: (kv[1][0]["context_length"] or 0,
                                                                    kv[1][0]["concurrency"])):
            firsts.setdefault(rs[0]["config"], series)
        for config, series in sorted(firsts.items()):
            rs = by_series[series]
            last = rs[-1]
            title = f"{b} {recipe}: {spec.label} {config} {point_label(last['concurrency'], last['context_length'])}"
            out += [f"**{title}** — last {last['mean']:.4g} {spec.unit} over {len(rs)} night(s)", ""]
            out += [*_mermaid(rs, title, spec.unit), ""]
    if images:
        out += ["PNG trend plots (in the run's artifacts): " + ", ".join(f"`{p.name}`" for p in images), ""]
    return "\n".join(out)
