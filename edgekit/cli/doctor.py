"""`edgekit doctor`: is this workstation ready for each stage?"""

from __future__ import annotations

import click
from rich.markup import escape
from rich.table import Table

from edgekit.cli import json_option
from edgekit.cli.app import App
from edgekit.doctor import as_dicts, run_checks


@click.command()
@json_option
@click.pass_obj
def doctor(app: App) -> None:
    """Check the tools each stage needs and say what to install for what is missing."""
    checks = run_checks()

    def human() -> None:
        table = Table()
        for col in ("", "tool", "found", "needed for", "install"):
            table.add_column(col)
        for c in checks:
            # escape: "edgekit-jetson[fleet]" is not rich markup
            table.add_row("[green]ok[/]" if c.ok else "[red]missing[/]", escape(c.name), escape(c.detail),
                          escape(c.blocks), "" if c.ok else escape(c.install))
        app.out.print(table)

    app.emit({"ok": all(c.ok for c in checks), "checks": as_dicts(checks)}, human)
