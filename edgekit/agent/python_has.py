"""`python-has`: what the Python that runs this verb has, for an engine that serves from a Python of its own (vLLM,
LiteRT-LM): ``<that python> <agent zipapp> python-has --dist vllm --module litert_lm``. The zipapp runs under any
Python ≥ 3.8, so the engine's own interpreter answers, as the service will run it.

Answers ``python`` (its version), ``dists`` (name → installed version, or null) and ``modules`` (name → null when
it imports, else why not: its exception, one line). Standard library only.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any


def _version(dist: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return None


def _imports(module: str) -> str | None:
    try:
        importlib.import_module(module)
    except Exception as exc:  # whatever stops the import is the answer
        return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}".rstrip(": ")
    return None


def report(dists: list[str], modules: list[str]) -> dict[str, Any]:
    return {"python": sys.version.split()[0], "dists": {d: _version(d) for d in dists},
            "modules": {m: _imports(m) for m in modules}}
