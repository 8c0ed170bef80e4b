"""The application object every command receives through the Click context."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console

if TYPE_CHECKING:  # imported when a command reads the board file: pydantic costs ≈ 0.1 s of every start
    from edgekit.config.boardfile import Board, Boards


@dataclass
class App:
    config: str | None = None
    json: bool = False
    verbose: bool = False
    console: Console = field(default_factory=lambda: Console(stderr=True, highlight=False))
    out: Console = field(default_factory=lambda: Console(highlight=False, soft_wrap=True))

    @property
    def board_file(self) -> Path:
        from edgekit.config.boardfile import board_file_path

        return board_file_path(self.config)

    def boards(self) -> Boards:
        from edgekit.engines.board_check import board_file

        return board_file(self.board_file)  # its engine sections checked by their engines

    def board(self, name: str) -> Board:
        return self.boards().get(name)

    def emit(self, data: Any, human: Callable[[], None] | None = None) -> None:
        """JSON on stdout when --json was given, else the human rendering (or pretty JSON)."""
        if self.json or human is None:
            sys.stdout.write(json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")
        else:
            human()

    def log(self, message: str) -> None:
        if self.verbose:
            self.console.print(f"[dim]{message}[/dim]")

    def info(self, message: str) -> None:
        """Progress for people: stderr, so --json output on stdout stays clean."""
        self.console.print(message)
