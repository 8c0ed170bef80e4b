"""llama.cpp for Jetson boards: pinned source, cross toolchains (aarch64 + CUDA), cached builds.

Public entry points:
    ensure_source(src)            the llama.cpp tree (convert uses its converter and gguf-py)
    build(BuildOptions(...))      → BuildResult (a store artifact; skipped when inputs are unchanged)
    prepare(BuildOptions(...))    → BuildPlan (what --dry-run prints)
    host_build_for_tests()        the host CPU build from the PyPI sdist, for tests and the sim
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgekit.build.source import (
    LLAMA_CPP_COMMIT,
    LLAMA_CPP_SHORT,
    cached_sdist,
    ensure_source,
    fetch_sdist,
    resolve_source,
)

if TYPE_CHECKING:
    from edgekit.build.builder import KIND, BuildOptions, BuildResult, build, build_key, prepare
    from edgekit.build.targets import BINARIES

# The builder and the targets import the board profiles (pydantic, ≈ 0.1 s): loaded on first use, so that
# `edgekit repack` and `convert`, which only need the source tree, start their converter worker sooner.
_LAZY = {"KIND": "builder", "BuildOptions": "builder", "BuildResult": "builder", "build": "builder",
         "build_key": "builder", "prepare": "builder", "BINARIES": "targets"}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)


__all__ = [
    "BINARIES", "KIND", "LLAMA_CPP_COMMIT", "LLAMA_CPP_SHORT", "BuildOptions", "BuildResult", "build",
    "build_key", "cached_sdist", "ensure_source", "fetch_sdist", "host_build_for_tests", "prepare",
    "resolve_source", "sdist_source",
]


def sdist_source() -> Path:
    """The llama.cpp tree from the llama-cpp-python sdist (downloaded from PyPI once)."""
    return ensure_source(fetch_sdist())


def host_build_for_tests(target: str = "host", cpu_only: bool = True) -> BuildResult:
    """The host CPU build from the sdist: cold 5 to 15 min on 2 cores, then cached (< 1 s).

    For conftest.py: ``result.bin_dir / "llama-server"`` is a ready binary with its libraries.
    """
    from edgekit.build.builder import BuildOptions, build

    return build(BuildOptions(target=target, cpu_only=cpu_only, src=str(fetch_sdist())))
