"""Results in github-action-benchmark's custom format, for teams who already chart with it.

github-action-benchmark takes one JSON list per `tool`: `customBiggerIsBetter` (tok/s, acceptance)
and `customSmallerIsBetter` (J/token), each entry {name, unit, value, range?, extra?}. Names carry
board, recipe, configuration and point, so one benchmark-data page can hold a whole fleet.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from edgekit.history.metrics import METRICS, MetricSamples, metrics_from_results
from edgekit.history.store import History

TOOLS = {"bigger": "customBiggerIsBetter", "smaller": "customSmallerIsBetter"}


def _entry(m: MetricSamples) -> dict[str, Any]:
    n = len(m.values)
    mean = sum(m.values) / n
    entry: dict[str, Any] = {"name": f"{m.board} {m.recipe} {m.config} {m.point} {METRICS[m.metric].label}",
                             "unit": m.unit, "value": round(mean, 6)}
    if n > 1:
        sd = math.sqrt(sum((v - mean) ** 2 for v in m.values) / (n - 1))
        entry["range"] = f"± {sd:.4g}"  # one standard deviation of the repetitions
    entry["extra"] = f"n={n} release={m.release or '?'} llama.cpp={m.llama_ref or '?'}"
    return entry


def benchmark_action(samples: list[MetricSamples]) -> dict[str, list[dict[str, Any]]]:
    """{"customBiggerIsBetter": [...], "customSmallerIsBetter": [...]} for the given series."""
    out: dict[str, list[dict[str, Any]]] = {tool: [] for tool in TOOLS.values()}
    for m in samples:
        out[TOOLS[m.direction]].append(_entry(m))
    return out


def from_results(results: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    return benchmark_action(metrics_from_results(results))


def write_benchmark_action(data: dict[str, list[dict[str, Any]]], out_dir: Path) -> dict[str, Path]:
    """customBiggerIsBetter.json and customSmallerIsBetter.json under ``out_dir`` (one per `tool`)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    files = {}
    for tool, entries in data.items():
        path = out_dir / f"{tool}.json"
        path.write_text(json.dumps(entries, indent=1) + "\n")
        files[tool] = path
    return files


def latest_samples(history: History, board: str | None = None) -> list[MetricSamples]:
    """The most recent night's series of each board and recipe in the history."""
    latest: dict[tuple[str, str], int] = {}
    for run in history.runs(board=board):
        latest[(run.board, run.recipe)] = run.id  # runs() is oldest first
    keep = set(latest.values())
    return [MetricSamples(metric=r["metric"], direction=r["direction"], unit=r["unit"], values=tuple(r["values"]),
                          board=r["board"], recipe=r["recipe"], config=r["config"], concurrency=r["concurrency"],
                          context_length=r["context_length"], release=r["release"], llama_ref=r["llama_ref"])
            for r in history.series_rows(board=board) if r["run_id"] in keep]
