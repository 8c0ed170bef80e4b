"""`edgekit push`: the push stage alone — a recipe's release onto a board, verified, not activated."""

from __future__ import annotations

import shlex

import click

from edgekit.cli import board_option, json_option
from edgekit.cli.app import App
from edgekit.engines.recipe_check import load_recipe


@click.command()
@board_option
@click.option("--recipe", "recipe_name", required=True, metavar="RECIPE", help="Recipe name or path.")
@click.option("--src", metavar="PATH", help="llama.cpp source (dir or tarball) instead of the pinned git ref.")
@click.option("--wait", "wait_s", type=click.IntRange(0, 3600), default=0, show_default=True,
              help="Seconds to wait for another deploy to the same board.")
@click.option("--cuda", type=click.Choice(["auto", "on", "off"]), default="auto", show_default=True,
              help="A Jetson's CUDA build: auto = when the board has a GPU driver.")
@json_option
@click.pass_obj
def push(app: App, board_name: str, recipe_name: str, src: str | None, wait_s: int, cuda: str) -> None:
    """Send RECIPE's release to a board without activating it.

    Builds and converts as `deploy` would (cached), then sends only the blobs the board lacks into its
    store, each checked by sha256 on the board and renamed into place only when complete; a cut push
    resumes. What the board serves does not change: `edgekit deploy` later activates the release with
    nothing left to send (e.g. push during the day, switch in a maintenance window).
    """
    from edgekit.deploy.pipeline import DeployOptions, check_host
    from edgekit.deploy.pipeline import push as run_push
    from edgekit.remote.transfer import TransferProgress

    recipe = load_recipe(recipe_name)
    check_host(recipe)  # a missing extra first: nothing is looked up, built or sent
    board = app.board(board_name)
    with TransferProgress(console=app.console) as progress:
        outcome = run_push(board_name, board, recipe, DeployOptions(src=src, wait_s=wait_s, cuda=cuda), app.console,
                           progress=progress)
    # The recipe as the user named it: a path's recipe may share its name with a built-in one.
    activate = shlex.join(["edgekit", "deploy", "--board", board_name, "--recipe", recipe_name])

    def human() -> None:
        app.out.print(outcome.headline())
        app.out.print(f"Activate it with: {activate}", markup=False, highlight=False)

    app.emit(outcome.to_dict(), human)
