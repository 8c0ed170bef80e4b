"""Serving engines, one module each, behind one seam (`base.Engine`) that deploy, health, status and
rollback share: what a release ships, the server's argv, how health and acceptance are read. Which engines
exist is one table, edgekit.config.engine_table (name → "module:Class", plus any $EDGEKIT_ENGINES registers);
a module is imported when its engine is first asked for. What an engine can do is declared on its class
(`capabilities.EngineBase`): bench, tune, report, plots and fleet ask it, and branch on no engine name.
"""

from __future__ import annotations

import importlib

from edgekit.config.engine_table import engine_classes, engine_names
from edgekit.engines.base import Engine, EngineRelease, ReleaseContext
from edgekit.engines.capabilities import EngineBase
from edgekit.errors import EdgekitError

ENGINES = engine_names()


def get_engine(name: str) -> EngineBase:
    table = engine_classes()
    target = table.get(name)
    if target is None:
        raise EdgekitError(f"Unknown engine {name!r}; edgekit serves with {', '.join(table)}.")
    module, cls = target.split(":")
    try:
        engine = getattr(importlib.import_module(module), cls)()
    except (ImportError, AttributeError) as exc:
        raise EdgekitError(f"Engine {name!r} ({target}) cannot be loaded: {exc}.") from exc
    if not isinstance(engine, EngineBase):
        raise EdgekitError(f"Engine {name!r} ({target}) is not built on edgekit.engines.EngineBase.")
    return engine


def find_engine(name: str | None) -> EngineBase | None:
    """The engine of that name, or None for a name the table lacks (an older or foreign results document)."""
    return get_engine(name) if name in engine_classes() else None


__all__ = ["ENGINES", "Engine", "EngineBase", "EngineRelease", "ReleaseContext", "find_engine", "get_engine"]
