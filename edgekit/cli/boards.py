"""`edgekit boards list`: the boards of the board file."""

from __future__ import annotations

import click
from rich.table import Table

from edgekit.cli import json_option
from edgekit.cli.app import App


@click.group()
def boards() -> None:
    """The boards in the board file."""


@boards.command("list")
@json_option
@click.pass_obj
def list_(app: App) -> None:
    """List the boards of the board file with their address and profile."""
    data = app.boards().load()
    rows = [
        {"name": name, **b.model_dump(exclude_none=True)}
        for name, b in sorted(data.boards.items())
    ]

    def human() -> None:
        if not rows:
            app.out.print(f"No boards in {app.board_file}. Add one there, or run `edgekit sim up`.")
            return
        table = Table(title=str(app.board_file))
        for col in ("name", "address", "user", "profile", "base", "kind"):
            table.add_column(col)
        for r in rows:
            kind = "sim" if r.get("sim") else "local" if r.get("local") else "board"
            table.add_row(r["name"], f"{r['host']}:{r['port']}", r["user"], r["profile"], r["base"], kind)
        app.out.print(table)

    app.emit({"board_file": str(app.board_file), "boards": rows, "groups": data.groups}, human)
