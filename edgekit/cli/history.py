"""`edgekit history add|show|plot|export` and `edgekit gate`: nightly results over time."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import click

from edgekit.cli import json_option
from edgekit.cli.app import App
from edgekit.errors import EdgekitError

db_option = click.option("--db", "--history", "db", type=click.Path(dir_okay=False, path_type=Path),
                         envvar="EDGEKIT_HISTORY", show_envvar=True,
                         help="History file (default: ~/.local/share/edgekit/history.sqlite).")


def _load(path: Path) -> dict[str, Any]:
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise EdgekitError(f"{path} does not exist.") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise EdgekitError(f"Cannot read {path}: {exc}.") from None
    except json.JSONDecodeError as exc:
        raise EdgekitError(f"{path} is not JSON ({exc.msg} at line {exc.lineno}).") from None
    if not isinstance(doc, dict):
        raise EdgekitError(f"{path} is not a results document (expected a JSON object).")
    return doc


def _open(db: Path | None) -> Any:
    from edgekit.history.store import History

    return History(db)


@click.group()
def history() -> None:
    """Nightly benchmark history: record results, show and plot trends, export."""


@history.command()
@click.argument("results", nargs=-1, required=True, type=click.Path(dir_okay=False, path_type=Path))
@db_option
@json_option
@click.pass_obj
def add(app: App, results: tuple[Path, ...], db: Path | None) -> None:
    """Record RESULTS.json files from `edgekit bench` (the same file twice is recorded once)."""
    docs = [(p, _load(p)) for p in results]
    out = []
    with _open(db) as h:
        for path, doc in docs:
            added = h.add(doc, source=str(path))
            r = added.run
            out.append({"file": str(path), "run_id": r.id, "new": added.new, "board": r.board, "recipe": r.recipe,
                        "created": r.created, "release": r.release, "llama_ref": r.llama_ref, "series": added.series})
        where = str(h.path)

    def human() -> None:
        for o in out:
            verb = "added" if o["new"] else "already recorded"
            app.out.print(f"{verb}: run {o['run_id']} {o['board']} / {o['recipe']} ({o['created']}, "
                          f"{o['series']} series) → {where}")

    app.emit({"db": where, "runs": out}, human)


@history.command()
@db_option
@click.option("--board", metavar="NAME", help="Only this board.")
@click.option("--recipe", metavar="NAME", help="Only this recipe.")
@click.option("--metric", type=click.Choice(["tokens_per_second", "acceptance", "joules_per_token"]),
              help="Only this metric.")
@click.option("--last", "last", type=click.IntRange(1, 10000), default=10, show_default=True,
              help="Nights per board and recipe.")
@json_option
@click.pass_obj
def show(app: App, db: Path | None, board: str | None, recipe: str | None, metric: str | None, last: int) -> None:
    """The recorded nights: mean, repetitions and spread per series."""
    from edgekit.history.metrics import METRICS, point_label

    with _open(db) as h:
        rows = h.series_rows(board=board, metric=metric, recipe=recipe)
    nights: dict[tuple[str, str], list[int]] = {}
    for r in rows:
        ids = nights.setdefault((r["board"], r["recipe"]), [])
        if r["run_id"] not in ids:
            ids.append(r["run_id"])
    keep = {i for ids in nights.values() for i in ids[-last:]}
    rows = [r for r in rows if r["run_id"] in keep]

    def human() -> None:
        from rich.table import Table

        if not rows:
            app.out.print("No nights recorded" + (" for that selection." if board or metric or recipe else " yet."))
            return
        for b, rcp in nights:
            table = Table(title=f"{b} / {rcp}", title_justify="left")
            for col in ("night (UTC)", "series", "mean", "n", "CV", "release"):
                table.add_column(col, no_wrap=col != "release")
            for r in (r for r in rows if (r["board"], r["recipe"]) == (b, rcp)):
                n, mean = r["n"], r["mean"]
                sd = (sum((v - mean) ** 2 for v in r["values"]) / (n - 1)) ** 0.5 if n > 1 else None
                point = point_label(r["concurrency"], r["context_length"])
                series = f"{METRICS[r['metric']].label} {r['config']} {point}"
                table.add_row(time.strftime("%Y-%m-%d %H:%M", time.gmtime(r["created_ts"])), series, f"{mean:.4g}",
                              str(n), f"{sd / mean:.1%}" if sd is not None and mean else "–", r["release"] or "–")
            app.out.print(table)

    app.emit(rows, human)


@history.command()
@db_option
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Directory for the PNGs and trends.md.")
@click.option("--board", metavar="NAME", help="Only this board.")
@click.option("--metric", type=click.Choice(["tokens_per_second", "acceptance", "joules_per_token"]),
              help="Only this metric.")
@json_option
@click.pass_obj
def plot(app: App, db: Path | None, out_dir: Path, board: str | None, metric: str | None) -> None:
    """Trend PNG per board, recipe and metric (releases and llama.cpp refs marked), and trends.md."""
    from edgekit.history.plots import trends_markdown, write_plots

    with _open(db) as h:
        files = write_plots(h, out_dir, board=board, metric=metric)
        md = trends_markdown(h, board=board, images=files)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "trends.md").write_text(md)
    result = {"plots": [str(p) for p in files], "markdown": str(out_dir / "trends.md")}

    def human() -> None:
        if not files:
            app.out.print("No nights recorded yet: nothing to plot.")
        for p in files:
            app.out.print(str(p))

    app.emit(result, human)


@history.command()
@click.argument("results", required=False, type=click.Path(dir_okay=False, path_type=Path))
@db_option
@click.option("--board", metavar="NAME", help="From the history: only this board's latest night.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path),
              help="Write customBiggerIsBetter.json and customSmallerIsBetter.json here.")
@json_option
@click.pass_obj
def export(app: App, results: Path | None, db: Path | None, board: str | None, out_dir: Path | None) -> None:
    """github-action-benchmark custom JSON, from RESULTS.json or the latest night of each board."""
    from edgekit.history import export as ex

    if results is not None:
        data = ex.from_results(_load(results))
    else:
        with _open(db) as h:
            data = ex.benchmark_action(ex.latest_samples(h, board))
    files = ex.write_benchmark_action(data, out_dir) if out_dir else {}

    def human() -> None:
        if files:
            for tool, path in files.items():
                app.out.print(f"{tool}: {len(data[tool])} entries → {path}")
        else:
            click.echo(json.dumps(data, indent=1))

    app.emit(data, human)


@click.command()
@db_option
@click.option("--current", "current", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="Tonight's results.json from `edgekit bench`.")
@click.option("--threshold", "thresholds", multiple=True, metavar="PCT|METRIC=PCT",
              help="The change to catch (default 5%); per metric e.g. joules_per_token=8%. Repeatable.")
@click.option("--k", "k", type=click.IntRange(1, 365), default=7, show_default=True,
              help="Baseline: the last k nights.")
@click.option("--metric", "metrics", multiple=True, help="Judge only these metrics (default: all). Repeatable.")
@click.option("--update-baseline", is_flag=True,
              help="Accept this run: record it and start the baseline window here (exit 0).")
@click.option("--markdown", "markdown", type=click.Path(dir_okay=False, path_type=Path),
              help="Append the verdicts as a Markdown table to this file (e.g. $GITHUB_STEP_SUMMARY).")
@click.option("--seed", type=int, default=0, show_default=True, help="Bootstrap seed.")
@json_option
@click.pass_obj
def gate(app: App, db: Path | None, current: Path, thresholds: tuple[str, ...], k: int, metrics: tuple[str, ...],
         update_baseline: bool, markdown: Path | None, seed: int) -> None:
    """Fail (exit 1) when tonight regressed in tok/s, acceptance or J/token beyond noise.

    Per series: the change of the mean against the median of the last k nights, with a 99 %
    bootstrap CI; a regression when the CI is entirely on the bad side and the change is at least
    half the threshold. Improvements are reported the same way.
    """
    from edgekit.history.gate import GateFailed, Thresholds, run_gate

    doc = _load(current)
    th = Thresholds.parse(thresholds)
    with _open(db) as h:
        report = run_gate(h, doc, k=k, thresholds=th, seed=seed, update_baseline=update_baseline,
                          metrics=metrics or None)
    if markdown is not None:
        markdown.parent.mkdir(parents=True, exist_ok=True)
        with markdown.open("a") as f:
            f.write(report.markdown() + "\n")

    def human() -> None:
        for line in report.lines():
            app.out.print(line, markup=False, highlight=False)

    app.emit(report.to_json(), human)
    if report.failed:
        raise GateFailed(f"{len(report.regressions)} regression(s) on {report.board} / {report.recipe}; "
                         "see the lines above (accept them with --update-baseline).")
