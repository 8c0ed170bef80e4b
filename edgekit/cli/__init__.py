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

# The one table of commands: name → (module under edgekit.cli, the object there, the line `--help` shows:
# short enough to stay one line in an 80-column terminal).
# Nothing is imported to list them (hatch style); a command's module is imported when it runs.
COMMANDS: dict[str, tuple[str, str, str]] = {
    "demo": ("demo", "demo", "Simulated board up → probe → deploy → a completion you can paste."),
    "doctor": ("doctor", "doctor", "What this workstation lacks for each stage, and what to install."),
    "boards": ("boards", "boards", "The boards in the board file."),
    "board": ("board", "board", "One board: probe it, trust its host key."),
    "recipes": ("recipes", "recipes", "Recipes: where each comes from, validated; show one resolved."),
    "sim": ("sim", "sim", "Simulated Jetson boards on this machine (real sshd on 127.0.0.1)."),
    "build": ("build", "build", "Build llama.cpp for a board (cross, or on the board), cached."),
    "convert": ("convert", "convert", "A recipe's target and drafter to GGUF / LiteRT, in the store."),
    "repack": ("convert", "repack", "Exact Q4_0 repack of QAT weights (bit-identical)."),
    "verify": ("convert", "verify", "KL and top-1 agreement of a recipe's GGUF against its checkpoint."),
    "push": ("push", "push", "A release onto a board, verified, not activated."),
    "deploy": ("deploy", "deploy", "Build, convert, push, activate; roll back if unhealthy."),
    "status": ("deploy", "status", "A board's releases, what it serves, and its health."),
    "rollback": ("deploy", "rollback", "Switch a board back to its previous release."),
    "bench": ("bench", "bench", "tok/s, W and J per token with and without the drafter."),
    "tune": ("bench", "tune", "Sweep drafting settings on the board and deploy the best."),
    "drafter": ("drafter", "drafter", "MTP drafters: re-fit them to the deployed target."),
    "fleet": ("fleet", "fleet", "Roll releases out to groups of boards with Ansible."),
    "history": ("history", "history", "Nightly results over time (SQLite)."),
    "gate": ("history", "gate", "The regression gate over the history."),
    "ci": ("ci", "ci", "The nightly on-device benchmark workflow, for your own repository."),
}


class CommandLoadError(EdgekitError):
    """A listed command whose module cannot be imported: a broken install, said loudly."""


class LazyGroup(click.Group):
    """Lists commands from COMMANDS without importing them; imports a command's module when it runs.

    A command that fails to import is an error (never a command silently missing from `--help`)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        return load_command(name) if name in COMMANDS else None

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        with formatter.section("Commands"):
            formatter.write_dl([(name, short) for name, (_, _, short) in COMMANDS.items()])


def load_command(name: str) -> click.Command:
    module_name, attr, _ = COMMANDS[name]
    try:
        module = importlib.import_module(f"edgekit.cli.{module_name}")
        command = getattr(module, attr)
    except (ImportError, AttributeError) as exc:
        raise CommandLoadError(f"The command {name!r} could not be loaded ({exc}); this edgekit install is "
                               "broken: reinstall it.") from exc
    if not isinstance(command, click.Command):
        raise CommandLoadError(f"edgekit.cli.{module_name}.{attr} is not a click command.")
    return command


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
