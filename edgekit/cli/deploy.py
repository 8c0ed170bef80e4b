"""`edgekit deploy|rollback|status`: one board, one recipe."""

from __future__ import annotations

import click
from rich.table import Table

from edgekit.cli import board_option, json_option
from edgekit.cli.app import App
from edgekit.deploy import activate as act
from edgekit.deploy import exposure
from edgekit.deploy.activate import HealthCheckFailed
from edgekit.deploy.health import check_release
from edgekit.engines.recipe_check import load_recipe
from edgekit.errors import EdgekitError
from edgekit.release.manifest import ReleaseManifest
from edgekit.remote import releases
from edgekit.remote.probe import probe
from edgekit.remote.runner import runner_for


def _fail_with_logs(app: App, exc: HealthCheckFailed) -> None:
    if exc.logs:
        app.console.print("[dim]last lines of the server log:[/dim]")
        app.console.print(exc.logs, markup=False, highlight=False)
    raise EdgekitError(exc.message) from None


@click.command()
@board_option
@click.option("--recipe", "recipe_name", required=True, metavar="RECIPE", help="Recipe name or path.")
@click.option("--src", metavar="PATH", help="llama.cpp source (dir or tarball) instead of the pinned git ref.")
@click.option("--strategy", type=click.Choice(["auto", "candidate", "in-place"]), default="auto",
              show_default=True, help="Health-check the new release beside the old one, or in its place.")
@click.option("--keep", type=click.IntRange(1, 100), help="Releases to keep on the board (default: recipe).")
@click.option("--wait", "wait_s", type=click.IntRange(0, 3600), default=0, show_default=True,
              help="Seconds to wait for another deploy to the same board.")
@click.option("--health-timeout", type=float, default=180.0, show_default=True)
@click.option("--cuda", type=click.Choice(["auto", "on", "off"]), default="auto", show_default=True,
              help="A Jetson's CUDA build: auto = when the board has a GPU driver (an emulated board has "
                   "none); on = also without one (it then runs on the CPU, and health says so).")
@click.option("--remeasure", is_flag=True,
              help="runtime.spec auto: measure the drafter against the target alone again, even where this "
                   "release was decided before.")
@json_option
@click.pass_obj
def deploy(app: App, board_name: str, recipe_name: str, src: str | None, strategy: str, keep: int | None,
           wait_s: int, health_timeout: float, cuda: str, remeasure: bool) -> None:
    """Build, convert, push and start RECIPE on a board; roll back if it is not healthy.

    With `runtime.spec: auto` (the built-in Jetson recipes), the drafter is then measured against the target
    alone on the board, and the target alone is served unless the drafter wins.
    """
    from edgekit.deploy.pipeline import DeployOptions, check_host
    from edgekit.deploy.pipeline import deploy as run_deploy
    from edgekit.remote.transfer import TransferProgress

    recipe = load_recipe(recipe_name)
    check_host(recipe)  # a missing extra first: nothing is looked up, built or sent
    board = app.board(board_name)
    options = DeployOptions(src=src, strategy=strategy, wait_s=wait_s, health_timeout_s=health_timeout, keep=keep,
                            cuda=cuda)
    try:
        with TransferProgress(console=app.console) as progress:
            if recipe.runtime.spec == "auto" and recipe.drafter is not None:
                from edgekit.bench.spec_auto import deploy_auto

                report = deploy_auto(board_name, board, recipe, options, app.console,
                                     say=lambda m: app.info(f"[dim]{board_name}: {m}[/dim]"), progress=progress,
                                     remeasure=remeasure)
            else:
                report = run_deploy(board_name, board, recipe, options, app.console, progress=progress)
    except HealthCheckFailed as exc:
        _fail_with_logs(app, exc)
    app.emit(report.to_dict(), lambda: app.out.print(report.headline()))


@click.command()
@board_option
@click.option("--to", "to_release", metavar="RELEASE", help="A specific release (default: the one before current).")
@json_option
@click.pass_obj
def rollback(app: App, board_name: str, to_release: str | None) -> None:
    """Switch the board back to its previous release, restart and check it."""
    board = app.board(board_name)
    with runner_for(board, board_name) as runner:
        facts = probe(runner, board.base)
        try:
            result = act.rollback(runner, facts.base, sudo=facts.sudo_prefix, to=to_release)
        except HealthCheckFailed as exc:
            _fail_with_logs(app, exc)
        notes = exposure.after_rollback(runner, facts.base, result.release_id)
    data = {"board": board_name, **result.to_dict(), "notes": notes}
    app.emit(data, lambda: app.out.print("\n".join([f"{board_name}: rolled back to {result.release_id} "
                                                    f"(was {result.previous}); healthy", *notes])))


def watchdog_line(wd: dict) -> str:
    """The watchdog's record in one line: restarts, the newest one, a rollback."""
    parts = [f"{len(wd['restarts'])} restart(s)"]
    if wd["restarts"]:
        last = wd["restarts"][-1]
        parts.append(f"last {last['at']}: {last['reason']}")
    if wd["rolled_back"]:
        rb = wd["rolled_back"]
        parts.append(f"rolled back {rb['from']} → {rb['to']} at {rb['at']}")
    return "; ".join(parts)


@click.command()
@board_option
@json_option
@click.pass_obj
def status(app: App, board_name: str) -> None:
    """The board's current release, what it serves, its health, and the older releases."""
    board = app.board(board_name)
    with runner_for(board, board_name) as runner:
        facts = probe(runner, board.base)
        lay = releases.layout(runner, facts.base)
        manifest = (ReleaseManifest.read(releases.read_manifest(runner, facts.base, lay.current),
                                         f"release {lay.current} on board {board_name!r}") if lay.current else None)
        unit = act.active_unit(runner, facts.sudo_prefix)
        active = unit is not None
        health = None
        if manifest is not None and unit is not None:  # the unit says where its server logs (an older one elsewhere)
            health = check_release(runner, facts.base, manifest, act.BoardPaths(facts.base).log, timeout=30,
                                   unit=unit).to_dict()
        watchdog = releases.read_watchdog(runner, facts.base) or {}
    data = {
        "board": board_name, "engine": manifest.engine if manifest else None,
        "current": lay.current, "serving": lay.serving, "service_active": active,
        "recipe": manifest.recipe if manifest else None, "port": manifest.port if manifest else None,
        "spec_type": manifest.spec_type if manifest else None,
        "spec_decision": manifest.runtime.get("spec_decision") if manifest else None,
        "server_args": manifest.server_args if manifest else None, "health": health, "releases": lay.releases,
        "watchdog": {"restarts": watchdog.get("restarts") or [], "last_failure": watchdog.get("last_failure"),
                     "rolled_back": watchdog.get("rolled_back")},
    }

    def human() -> None:
        table = Table(title=f"board {board_name}", show_header=False)
        for key in ("engine", "current", "serving", "service_active", "recipe", "port", "spec_type"):
            table.add_row(key, str(data[key]))
        if health:
            table.add_row("health", "ok" if health["ok"] else f"FAILING: {health['reason']}")
            if health.get("tokens_per_second"):
                table.add_row("tok/s", f"{health['tokens_per_second']:.1f}")
            if health.get("gpu"):
                table.add_row("GPU", health["gpu"])
        if data["spec_decision"]:
            table.add_row("drafter", f"{data['spec_decision'].get('reason')} "
                                     f"(measured {data['spec_decision'].get('measured_at')})")
        table.add_row("releases", ", ".join(lay.releases) or "none")
        table.add_row("watchdog", watchdog_line(data["watchdog"]))
        app.out.print(table)

    app.emit(data, human)
