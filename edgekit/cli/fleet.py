"""`edgekit fleet inventory|rollout|status|rollback`: many boards at once, through Ansible."""

from __future__ import annotations

import json

import click
from rich.table import Table

from edgekit.cli import json_option
from edgekit.cli.app import App
from edgekit.engines.recipe_check import load_recipe
from edgekit.errors import EdgekitError

group_option = click.option("--group", metavar="GROUP", help="A board-file group (or one board); default: all boards.")
batch_option = click.option("--batch", "batch", default=None, metavar="SIZES",
                            help="Ansible `serial` after the canary: board counts or percentages, e.g. 1,25%,100%.")
max_fail_option = click.option("--max-fail", "max_fail", type=click.IntRange(0, 100), default=None, metavar="PCT",
                               help="Stop when more than PCT% of a batch fails (Ansible's max_fail_percentage).")


@click.group()
def fleet() -> None:
    """Roll releases out to groups of boards with Ansible: canary, batches, health-gated, rollback."""


@fleet.command()
@group_option
@json_option
@click.pass_obj
def inventory(app: App, group: str | None) -> None:
    """Print an Ansible inventory (YAML) rendered from the board file."""
    from edgekit.fleet import inventory as inv
    from edgekit.fleet.rollout import choose_canary, run_inventory

    data = app.boards().load()
    names = inv.select(data, group=group)
    rendered = run_inventory(data, names, choose_canary(data, names, None))
    if app.json:
        click.echo(json.dumps(rendered, indent=2))
    else:
        click.echo(inv.to_yaml(rendered), nl=False)


def _success_cells(row: dict, check: bool) -> tuple[str, str, str]:
    """(result, release, detail) of a board that succeeded (or, with --check, what would happen)."""
    release = str(row.get("release"))
    if check:
        push = row.get("push") or {}
        would = []
        if push.get("missing_blobs"):
            would.append(f"send {push['missing_blobs']} blobs ({push.get('missing_bytes', 0) / 1e6:.1f} MB)")
        if row.get("would_create_release"):
            would.append("create the release")
        if row.get("would_activate"):
            would.append(f"start it ({row.get('strategy')}) and switch from {row.get('previous') or 'nothing'}")
        if would:
            return "[yellow]would change[/yellow]", release, "would " + ", ".join(would)
        return "[green]unchanged[/green]", release, "already current and healthy"
    h = row.get("health") or {}
    tps = f"{h['tokens_per_second']:.0f} tok/s" if h.get("tokens_per_second") else ""
    drafts = f", {h['draft_n']} drafted" if h.get("draft_n") else ""
    sent = (row.get("push") or {}).get("sent_bytes") or 0
    what = "changed" if row.get("changed") else "unchanged"
    return f"[green]{what}[/green]", release, f"{tps}{drafts}" + (f"; sent {sent / 1e6:.1f} MB" if sent else "")


def _summary_table(app: App, summary: object) -> None:
    from edgekit.fleet.report import FleetSummary

    assert isinstance(summary, FleetSummary)
    table = Table(title=summary.headline())
    for col in ("board", "result", "release", "detail"):
        table.add_column(col, overflow="fold")
    for name, row in summary.succeeded.items():
        table.add_row(name, *_success_cells(row, summary.check))
    for name, row in summary.failed.items():
        table.add_row(name, "[red]failed[/red]", str(row.get("release") or ""), row["reason"])
    for name in summary.untouched:
        table.add_row(name, "[yellow]untouched[/yellow]", "", "not reached: the run stopped first"
                      if summary.stopped else "")
    app.out.print(table)


def _finish(app: App, summary: object) -> None:
    from edgekit.fleet.report import FleetSummary

    assert isinstance(summary, FleetSummary)
    app.emit(summary.to_dict(), lambda: _summary_table(app, summary))
    if summary.failed:
        names = ", ".join(sorted(summary.failed))
        raise EdgekitError(f"{len(summary.failed)} of {len(summary.boards)} boards failed ({names}); "
                           f"{len(summary.untouched)} untouched.")


@fleet.command()
@click.option("--recipe", "recipe_name", required=True, metavar="RECIPE", help="Recipe name or path.")
@group_option
@batch_option
@max_fail_option
@click.option("--check", is_flag=True, help="Show what would change on each board; change nothing.")
@click.option("--canary", metavar="NAME", help="Canary group or board (default: the `canary` group, else the first).")
@click.option("--no-canary", is_flag=True, help="No canary: every board goes in the batches.")
@click.option("--strategy", type=click.Choice(["auto", "candidate", "in-place"]), default="auto", show_default=True)
@click.option("--keep", type=click.IntRange(1, 100), help="Releases to keep on each board (default: recipe).")
@click.option("--health-timeout", type=float, default=180.0, show_default=True)
@click.option("--src", metavar="PATH", help="llama.cpp source (dir or tarball) instead of the pinned git ref.")
@click.option("--forks", type=click.IntRange(1, 500), help="Ansible forks (default: the largest batch).")
@click.option("--wait", "wait_s", type=click.IntRange(0, 3600), default=0, show_default=True,
              help="Seconds to wait for another deploy's lock on a board.")
@json_option
@click.pass_obj
def rollout(app: App, recipe_name: str, group: str | None, batch: str | None, max_fail: int | None, check: bool,
            canary: str | None, no_canary: bool, strategy: str, keep: int | None, health_timeout: float,
            src: str | None, forks: int | None, wait_s: int) -> None:
    """Build and convert once per profile, then roll RECIPE out: canary first, then batches."""
    from edgekit.fleet.playbook import parse_batches
    from edgekit.fleet.rollout import RolloutOptions
    from edgekit.fleet.rollout import rollout as run_rollout

    options = RolloutOptions(recipe=recipe_name, group=group, check=check, canary=canary, no_canary=no_canary,
                             src=src, strategy=strategy, keep=keep, health_timeout=health_timeout, forks=forks,
                             wait_s=wait_s, max_fail=0 if max_fail is None else max_fail)
    if batch:
        options.batches = parse_batches(batch)
    recipe = load_recipe(recipe_name)
    if recipe.runtime.spec == "auto" and recipe.drafter is not None:
        app.info(f"[dim]{recipe.name} has runtime.spec auto: a fleet serves its drafter (auto is decided per board "
                 "by `edgekit deploy`; give the fleet's recipe spec: on or off).[/dim]")
    summary = run_rollout(app.board_file, options, app.console, quiet=app.json and not app.verbose)
    _finish(app, summary)


@fleet.command()
@group_option
@click.option("--to", "to_release", metavar="RELEASE", help="A specific release (default: the one before current).")
@batch_option
@max_fail_option
@click.option("--health-timeout", type=float, default=180.0, show_default=True)
@json_option
@click.pass_obj
def rollback(app: App, group: str | None, to_release: str | None, batch: str | None, max_fail: int | None,
             health_timeout: float) -> None:
    """Switch boards back to their previous release (health-gated)."""
    from edgekit.fleet.playbook import parse_batches
    from edgekit.fleet.rollout import rollback as run_rollback

    summary = run_rollback(app.board_file, group, to_release, parse_batches(batch or "100%"),
                           100 if max_fail is None else max_fail, app.console, health_timeout,
                           quiet=app.json and not app.verbose)
    _finish(app, summary)


@fleet.command()
@group_option
@json_option
@click.pass_obj
def status(app: App, group: str | None) -> None:
    """Each board's release, recipe and health, in one table."""
    from edgekit.fleet.rollout import status as run_status

    data = run_status(app.board_file, group, app.console, quiet=not app.verbose)

    def human() -> None:
        table = Table(title="fleet status")
        for col in ("board", "current", "serving", "recipe", "health", "releases"):
            table.add_column(col, overflow="fold")
        for name, row in data["boards"].items():
            if not row.get("reachable"):
                table.add_row(name, "[red]unreachable[/red]", "", "", row.get("error", ""), "")
                continue
            h = row.get("health")
            health = ("ok" if h["ok"] else f"[red]FAILING: {h['reason']}[/red]") if h else (
                "service inactive" if row.get("current") else "-")
            table.add_row(name, str(row.get("current")), str(row.get("serving")), str(row.get("recipe")), health,
                          str(len(row.get("releases") or [])))
        app.out.print(table)

    app.emit(data, human)
