"""Serving engines, one module each, behind one seam (`base.Engine`) that deploy, health, status and
rollback share: what a release ships, the server's argv, how health and acceptance are read. Which engines
exist is one table, edgekit.config.engine_table (name → "module:Class"); a module is imported when its
engine is first asked for. What an engine can do is declared on its class (`capabilities.EngineBase`):
bench, tune, report, plots and fleet ask it, and branch on no engine name.
"""

from __future__ import annotations

import importlib

from edgekit.config.engine_table import ENGINE_CLASSES, engine_names
from edgekit.engines.base import Engine, EngineRelease, ReleaseContext
from edgekit.engines.capabilities import EngineBase
from edgekit.errors import EdgekitError

ENGINES = engine_names()


def get_engine(name: str) -> EngineBase:
    target = ENGINE_CLASSES.get(name)
    if target is None:
        raise EdgekitError(f"Unknown engine {name!r}; edgekit serves with {', '.join(ENGINE_CLASSES)}.")
    module, cls = target.split(":")
    return getattr(importlib.import_module(module), cls)()


def find_engine(name: str | None) -> EngineBase | None:
    """The engine of that name, or None for a name the table lacks (an older or foreign results document)."""
    return get_engine(name) if name in ENGINE_CLASSES else None


__all__ = ["ENGINES", "Engine", "EngineBase", "EngineRelease", "ReleaseContext", "find_engine", "get_engine"]
