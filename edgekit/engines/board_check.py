"""A board file's engine sections, checked by their engines as the file is loaded.

``boards.<name>.<section>:`` holds what one engine needs of that board (vLLM's ``vllm: {python: …}``); the engine
that declares the section validates it with its own model (``EngineBase.BoardSettings``), so config/ knows no
engine's board settings. A key that is no engine's section is refused with the file and line; one written before
the sections (``vllm_python``) is refused naming its place (``vllm.python``).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import ValidationError

from edgekit.config.boardfile import BoardFile, Boards
from edgekit.config.yamlfile import first_problem, where_in
from edgekit.engines.recipe_check import sections
from edgekit.errors import EdgekitError

if TYPE_CHECKING:
    from edgekit.engines.capabilities import EngineBase


def _refusal(path: Path, loc: tuple[str | int, ...], msg: str) -> EdgekitError:
    return EdgekitError(f"{where_in(path, ('boards', *loc))}: field 'boards.{'.'.join(map(str, loc))}': {msg}.")


def check_board_file(data: BoardFile, path: Path) -> None:
    """Every board's engine sections, each validated by its engine."""
    if not any(b.model_extra for b in data.boards.values()):
        return  # no section: no engine need be imported
    owners = {key: e for key, e in sections().items() if e.BoardSettings is not None}
    for name, board in data.boards.items():
        for key, value in (board.model_extra or {}).items():
            engine = owners.get(key)
            if engine is None:
                raise _refusal(path, (name, key), _stray(name, key, owners))
            if not isinstance(value, dict):
                raise _refusal(path, (name, key), f"engine {engine.name}'s section, a mapping of its settings")
            try:
                engine.BoardSettings.model_validate(value)  # type: ignore[union-attr]
            except ValidationError as exc:
                loc, msg = first_problem(exc)
                raise _refusal(path, (name, key, *loc), msg) from None


def _stray(board: str, key: str, owners: dict[str, EngineBase]) -> str:
    """Why ``key`` is no board setting: a key written before the sections (``vllm_python``) names its place."""
    for section, engine in owners.items():
        field = key.removeprefix(f"{section}_")
        if field != key and engine.BoardSettings is not None and field in engine.BoardSettings.model_fields:
            return f"a setting of engine {engine.name}, which goes in its section: boards.{board}.{section}.{field}"
    return f"unknown field (an engine's own board settings go in its section: {', '.join(owners) or 'none'})"


def board_file(path: Path) -> Boards:
    """The board file at ``path``, its engine sections checked each time it is loaded."""
    return Boards(path, check=check_board_file)
