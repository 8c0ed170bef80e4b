"""The bench command's engine options: each engine declares its own (``EngineBase.bench_options``); the
command collects them when it runs (or shows its help), so ``edgekit`` itself starts without importing an
engine, and an engine registered by ``$EDGEKIT_ENGINES`` brings its options with it."""

from __future__ import annotations

from typing import Any

import click

from edgekit.config.engine_table import engine_names
from edgekit.engines import get_engine


def _declared() -> list[tuple[str, Any]]:
    return [(name, opt) for name in engine_names() for opt in get_engine(name).bench_options]


def _dest(flag: str) -> str:
    return "engine_opt_" + flag.lstrip("-").replace("-", "_")


class EngineOptionsCommand(click.Command):
    """A command whose parameters include every engine's bench options (``--litert-python`` …)."""

    collected = False

    def get_params(self, ctx: click.Context) -> list[click.Parameter]:
        if not self.collected:  # once: the engines are imported here, not when edgekit starts
            self.collected = True
            self.params.extend(
                click.Option([opt.flag, _dest(opt.flag)], metavar=opt.metavar, default=opt.default,
                             show_default=opt.default is not None, help=f"[{name}] {opt.help}",
                             type=click.Choice(list(opt.choices)) if opt.choices else opt.type)
                for name, opt in _declared())
        return super().get_params(ctx)


def collect(kw: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Engine name → its options' values, taken out of the command's keyword arguments."""
    out: dict[str, dict[str, Any]] = {}
    for name, opt in _declared():
        value = kw.pop(_dest(opt.flag), None)
        out.setdefault(name, {})[opt.key] = value
    return out
