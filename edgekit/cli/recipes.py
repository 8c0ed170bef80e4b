"""`edgekit recipes list|show|fit`: the recipes edgekit can deploy, and which boards' memory holds them."""

from __future__ import annotations

import click
from rich.table import Table

from edgekit.cli import json_option
from edgekit.cli.app import App
from edgekit.config.recipe_lookup import list_recipes
from edgekit.engines.recipe_check import load_recipe
from edgekit.errors import EdgekitError


@click.group()
def recipes() -> None:
    """Recipes: target + drafter, conversions, server and bench settings."""


@recipes.command("list")
@json_option
@click.pass_obj
def list_(app: App) -> None:
    """List the known recipes."""
    items = []
    for found in list_recipes():
        r = load_recipe(str(found.path))
        items.append({"name": r.name, "path": str(found.path), "origin": found.origin, "from": found.describe(),
                      "shadows": [str(p) for p in found.shadows], "description": r.description,
                      "drafter": r.drafter is not None, "spec_type": r.runtime.spec_type})

    def human() -> None:
        table = Table()
        for col in ("name", "spec-type", "from", "description"):
            table.add_column(col)
        for i in items:
            table.add_row(i["name"], i["spec_type"], i["from"], i["description"])
        app.out.print(table)

    app.emit(items, human)


@recipes.command("show")
@click.argument("recipe")
@json_option
@click.pass_obj
def show(app: App, recipe: str) -> None:
    """Validate a recipe (name or path) and print it resolved with defaults."""
    r = load_recipe(recipe)
    data = r.model_dump(mode="json")
    data["source_file"] = r.source_file
    data["from"] = r.origin
    app.emit(data, lambda: app.out.print_json(data=data))


def _memories(app: App, board: str | None) -> list[tuple[str, float, float, str]]:
    """(what, memory available in MB, bandwidth GB/s, profile) to size recipes against: a configured board's as its
    probe reads it (MemAvailable), a profile's as a freshly booted board of it reports, or every profile's."""
    from edgekit.config.profiles import ALIASES, PROFILES, get_profile

    if board is None:
        return [(p.name, p.mem_available_mb, p.mem_bandwidth_gbs, p.name) for p in PROFILES.values()]
    if board in PROFILES or board in ALIASES:
        p = get_profile(board)
        return [(p.name, p.mem_available_mb, p.mem_bandwidth_gbs, p.name)]
    from edgekit.remote.probe import probe
    from edgekit.remote.runner import runner_for

    entry = app.board(board)
    with runner_for(entry, board) as runner:
        facts = probe(runner, entry.base)
    if facts.mem_available_mb is None:
        raise EdgekitError(f"Board {board!r} does not say how much memory it has (no MemAvailable in /proc/meminfo).")
    return [(board, facts.mem_available_mb, get_profile(entry.profile).mem_bandwidth_gbs, entry.profile)]


@recipes.command("fit")
@click.option("--board", "board", default=None,
              help="A board of the board file (its memory as probed now) or a profile (orin-nano-8gb, thor …); "
                   "default: every profile.")
@click.option("--recipe", "names", multiple=True, help="Only these recipes (default: every known one).")
@json_option
@click.pass_obj
def fit(app: App, board: str | None, names: tuple[str, ...]) -> None:
    """Which recipes fit a board's memory, at which context: from the models' published structure, before a byte
    is downloaded (weights at the recipe's quantization, the KV cache as the engine allocates it, its compute
    buffers on that board's kind, the runtime)."""
    from edgekit.engines import get_engine
    from edgekit.engines.recipe_fit import fit_row

    chosen = [load_recipe(n) for n in names] if names else [load_recipe(str(f.path)) for f in list_recipes()]
    rows = []
    for what, mem_mb, bandwidth, profile in _memories(app, board):
        for r in chosen:
            row = {"board": what, **fit_row(r, get_engine(r.runtime.engine), mem_mb, profile)}
            if row.get("active_bytes_per_token"):  # one stream reads these each token: the decode ceiling
                row["ceiling_tokens_per_second"] = round(bandwidth * 1e9 / row["active_bytes_per_token"], 1)
            rows.append(row)

    def human() -> None:
        table = Table(title="Recipes against memory (text models, before download)")
        for col in ("board", "memory MB", "recipe", "weights MB", "need at ctx_size", "fits", "longest context",
                    "decode ceiling"):
            table.add_column(col)
        for row in rows:
            if not row["known"]:
                continue
            need = f"{row['need_at_ctx_size_mb']} MB at {row['ctx_size']}"
            longest = (f"{row['longest_context']} ({row['need_at_longest_mb']} MB)" if row["longest_context"]
                       else "none")
            table.add_row(row["board"], str(row["memory_mb"]), row["recipe"], str(row["weights_mb"]), need,
                          "yes" if row["fits"] else "[red]no[/red]", longest,
                          f"{row['ceiling_tokens_per_second']} tok/s")
        app.out.print(table)
        unknown = sorted({row["recipe"] for row in rows if not row["known"]})
        if unknown:
            app.out.print(f"[dim]sized once their models are made (deploy checks then): {', '.join(unknown)}[/dim]")

    app.emit(rows, human)
