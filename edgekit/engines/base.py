"""The engine seam: what deploy asks of a serving engine, and what it gets back."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from rich.console import Console

    from edgekit.config.boardfile import Board
    from edgekit.config.recipes import Recipe
    from edgekit.release.plan import ReleasePlan
    from edgekit.remote.probe import BoardFacts
    from edgekit.remote.runner import LocalRunner, SshRunner


@dataclass
class ReleaseContext:
    """Everything an engine may look at to make a board's release."""

    name: str  # the board's name in the board file
    board: Board
    facts: BoardFacts
    recipe: Recipe
    runner: SshRunner | LocalRunner
    console: Console
    say: Callable[[str], None]
    src: str | None = None  # llama.cpp source (llama.cpp engine; also its converter)
    cuda: str = "auto"  # auto | on | off (llama.cpp engine)


@dataclass
class EngineRelease:
    plan: ReleasePlan
    build: dict[str, Any] = field(default_factory=dict)  # what was built for the board (llama.cpp)
    stages: dict[str, float] = field(default_factory=dict)  # seconds per stage of making it


class Engine(Protocol):
    name: str
    # the HTTP dialect its server's health completion speaks: "llama" (llama-server's /completion with
    # `timings`) or "openai" (/v1/completions, draft counts from /metrics)
    health_api: str

    def release(self, ctx: ReleaseContext) -> EngineRelease:
        """Build/convert what the board needs and compose the release (files, units, release.json)."""
        ...
