"""`edgekit recipes list|show`: the recipes edgekit can deploy."""

from __future__ import annotations

import click
from rich.table import Table

from edgekit.cli import json_option
from edgekit.cli.app import App
from edgekit.config.recipe_lookup import list_recipes
from edgekit.engines.recipe_check import load_recipe


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
