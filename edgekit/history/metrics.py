"""From a bench results document (edgekit/data/results-schema.json) to the per-repetition series we track.

One series per (board, recipe, configuration, point, metric): tok/s and J/token for every
configuration, draft acceptance for the configurations that draft. Values are the per-repetition
numbers of the document's `runs`, so the gate sees the real run-to-run noise, not just a mean.
A document without `runs` (older or hand-made) falls back to `summary.points[*].<metric>.values`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

from edgekit.errors import EdgekitError

Direction = Literal["bigger", "smaller"]


@dataclass(frozen=True)
class MetricSpec:
    name: str
    label: str  # short, for tables and plot titles
    unit: str
    direction: Direction


# The metrics the history records and the gate judges, in display order.
METRICS: dict[str, MetricSpec] = {m.name: m for m in (
    MetricSpec("tokens_per_second", "tok/s", "tok/s", "bigger"),
    MetricSpec("acceptance", "acceptance", "fraction", "bigger"),
    MetricSpec("joules_per_token", "J/token", "J/token", "smaller"),
)}


@dataclass(frozen=True)
class MetricSamples:
    """One metric of one configuration at one point, with its per-repetition values and labels."""

    metric: str
    direction: Direction
    unit: str
    values: tuple[float, ...]
    board: str
    recipe: str
    config: str
    concurrency: int
    context_length: int | None
    release: str | None = None
    llama_ref: str | None = None

    @property
    def point(self) -> str:
        return point_label(self.concurrency, self.context_length)

    @property
    def series(self) -> str:
        """The key of this series within a board and recipe: config/point/metric."""
        return f"{self.config}/{self.point}/{self.metric}"

    @property
    def label(self) -> str:
        return f"{METRICS[self.metric].label} {self.config} {self.point}"


def point_label(concurrency: int | None, context_length: int | None) -> str:
    return f"c{concurrency or 1}" + (f" ctx{context_length}" if context_length else "")


def _finite(values: list[Any]) -> tuple[float, ...]:
    return tuple(float(v) for v in values if isinstance(v, (int, float)) and math.isfinite(v))


def _run_value(run: dict[str, Any], metric: str) -> Any:
    if metric == "joules_per_token":
        power = run.get("power") or {}
        return power.get("joules_per_token") if power.get("available") else None
    return run.get(metric)


Key = tuple[str, int, int | None, str]  # config, concurrency, context length, metric


def _config(entry: dict[str, Any]) -> str:
    """A sampled point is a series of its own, named by its configuration and temperature ("drafter T0.7"); a
    greedy one keeps the name every night before sampling had, so its series goes on."""
    temperature = float(entry.get("temperature") or 0.0)
    return str(entry.get("config")) + (f" T{temperature:g}" if temperature else "")


def _from_runs(runs: list[dict[str, Any]]) -> dict[Key, list[float]]:
    # Ordered by repetition so the stored rep index means what the bench meant by it.
    out: dict[Key, list[Any]] = {}
    for run in sorted(runs, key=lambda r: (r.get("repetition") or 0, r.get("index") or 0)):
        if run.get("errors") and not run.get("tokens"):
            continue  # a run that produced nothing is a failure, not a slow repetition
        at = (_config(run), int(run.get("concurrency") or 1), run.get("context_length") or None)
        for metric in METRICS:
            out.setdefault((*at, metric), []).append(_run_value(run, metric))
    return {k: list(_finite(v)) for k, v in out.items()}


def _from_summary(points: list[dict[str, Any]]) -> dict[Key, list[float]]:
    out: dict[Key, list[float]] = {}
    for p in points:
        at = (_config(p), int(p.get("concurrency") or 1), p.get("context_length") or None)
        for metric in METRICS:
            est = p.get(metric)
            values = est.get("values", []) if isinstance(est, dict) else ([est] if est is not None else [])
            out[(*at, metric)] = list(_finite(values))
    return out


def run_labels(results: dict[str, Any]) -> dict[str, Any]:
    """Board, recipe, release, llama.cpp ref and time of a results document (what a night is)."""
    if not isinstance(results, dict):
        raise EdgekitError("The results file is not a JSON object (expected `edgekit bench` results.json).")
    board = results.get("board")
    board_name = board.get("name") if isinstance(board, dict) else board
    recipe = results.get("recipe")
    recipe_name = recipe.get("name") if isinstance(recipe, dict) else recipe
    if not board_name or not recipe_name:
        raise EdgekitError("The results file names no board or recipe (expected `edgekit bench` results.json).")
    release = results.get("release") or {}
    llama = results.get("llama_cpp") or {}
    return {
        "board": str(board_name), "recipe": str(recipe_name),
        "release": release.get("id") if isinstance(release, dict) else release,
        "llama_ref": llama.get("ref") if isinstance(llama, dict) else llama,
        "created": results.get("created"),
        "edgekit_version": results.get("edgekit_version"),
        "sim": bool(board.get("sim")) if isinstance(board, dict) else False,
        "profile": board.get("profile") if isinstance(board, dict) else None,
        # nvpmodel's mode name (None where the board has none): a night is compared only with nights of its mode
        "power_mode": ((board.get("nvpmodel") or {}).get("name") if isinstance(board, dict) else None),
    }


def metrics_from_results(results: dict[str, Any]) -> list[MetricSamples]:
    """Every tracked series of a results document; series without a value are left out."""
    labels = run_labels(results)
    runs = results.get("runs")
    if isinstance(runs, list) and runs:
        table = _from_runs(runs)
    else:
        table = _from_summary(((results.get("summary") or {}).get("points")) or [])
    if not table:
        raise EdgekitError("The results file has no runs and no summary points to take metrics from.")
    out = []
    for (config, concurrency, context_length, metric), values in table.items():
        if not values:
            continue  # e.g. acceptance of the configuration without a drafter, J/token without power
        spec = METRICS[metric]
        out.append(MetricSamples(metric=metric, direction=spec.direction, unit=spec.unit, values=tuple(values),
                                 board=labels["board"], recipe=labels["recipe"], config=config,
                                 concurrency=concurrency, context_length=context_length,
                                 release=labels["release"], llama_ref=labels["llama_ref"]))
    order = list(METRICS)
    out.sort(key=lambda m: (order.index(m.metric), m.config, m.context_length or 0, m.concurrency))
    return out

