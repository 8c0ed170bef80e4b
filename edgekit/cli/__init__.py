"""The `edgekit` command line: a root group and one module per command group."""

from __future__ import annotations

import importlib
import os
import sys

# pydantic looks for plugins in every installed distribution's entry points when it builds the first
# model (≈ 30 ms of each command's start with torch, transformers and Ansible installed); edgekit uses none.
os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")

import click

from edgekit import __version__
from edgekit.cli.app import App
from edgekit.errors import EdgekitError

# name → module under edgekit.cli that defines a click command of the same name (hatch style).
COMMANDS = {
    "boards": "boards",
    "board": "board",
    "recipes": "recipes",
    "sim": "sim",
    "doctor": "doctor",
    "build": "build",
    "convert": "convert",
    "repack": "convert",
    "verify": "convert",
    "deploy": "deploy",
    "rollback": "deploy",
    "status": "deploy",
    "push": "push",
    "demo": "demo",
    "fleet": "fleet",
    "bench": "bench",
    "tune": "bench",
    "drafter": "drafter",
    "history": "history",
    "gate": "history",
}


class LazyGroup(click.Group):
    """Imports a command's module only when that command runs, so `edgekit --help` stays fast."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(n for n in COMMANDS if self._load(n, quiet=True) is not None)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        return self._load(name)

    @staticmethod
    def _load(name: str, quiet: bool = False) -> click.Command | None:
        module_name = COMMANDS.get(name)
        if module_name is None:
            return None
        try:
            module = importlib.import_module(f"edgekit.cli.{module_name}")
        except ModuleNotFoundError as exc:
            if quiet and exc.name and exc.name.startswith("edgekit.cli."):
                return None
            raise
        return getattr(module, name.replace("-", "_"), None)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--config", "config", envvar="EDGEKIT_CONFIG", metavar="PATH",
              help="Board file (default ./edgekit.yaml, then ~/.config/edgekit/edgekit.yaml).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable JSON on stdout.")
@click.option("-v", "--verbose", is_flag=True, help="Say more about what happens.")
@click.version_option(__version__, prog_name="edgekit")
@click.pass_context
def cli(ctx: click.Context, config: str | None, as_json: bool, verbose: bool) -> None:
    """Deploy Gemma 4 + MTP drafters to Jetson boards and measure them there."""
    ctx.obj = App(config=config, json=as_json, verbose=verbose)


def json_option(f: click.decorators.FC) -> click.decorators.FC:
    """`--json` after the subcommand too (`edgekit boards list --json`)."""

    def _set(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
        if value:
            ctx.find_object(App).json = True  # type: ignore[union-attr]

    return click.option("--json", "json_flag", is_flag=True, expose_value=False, callback=_set,
                        help="Machine-readable JSON on stdout.")(f)


board_option = click.option("--board", "board_name", required=True, metavar="NAME",
                            help="A board from the board file.")


def main() -> None:
    try:
        cli.main(standalone_mode=False, prog_name="edgekit")
    except EdgekitError as exc:
        click.echo(f"edgekit: {exc}", err=True)
        sys.exit(exc.exit_code)
    except click.exceptions.Abort:
        click.echo("edgekit: aborted.", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(2 if exc.exit_code == 2 else exc.exit_code)
    except KeyboardInterrupt:
        click.echo("edgekit: interrupted.", err=True)
        sys.exit(130)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
