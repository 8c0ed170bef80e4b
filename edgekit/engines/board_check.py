"""A board file's engine sections, checked by their engines as the file is loaded.

``boards.<name>.<section>:`` holds what one engine needs of that board (vLLM's ``vllm: {python: …}``); the engine
that declares the section validates it with its own model (``EngineBase.BoardSettings``), so config/ knows no
engine's board settings. A key that is no engine's section is refused with the file and line; one written before
the sections (``vllm_python``) is refused naming its place (``vllm.python``).
"""

from __future__ import annotations

from pathlib import Path

from pydantic import ValidationError

from edgekit.config.boardfile import BoardFile, Boards
from edgekit.config.yamlfile import where_in
from edgekit.engines.recipe_check import sections
from edgekit.errors import EdgekitError


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
                moved = next(((s, key[len(s) + 1:]) for s in owners if key.startswith(f"{s}_")
                              and key[len(s) + 1:] in owners[s].BoardSettings.model_fields), None)  # type: ignore[union-attr]
                raise _refusal(path, (name, key), f"a setting of engine {owners[moved[0]].name}, which goes in its "
                                                  f"section: boards.{name}.{moved[0]}.{moved[1]}" if moved else
                               "unknown field (an engine's own board settings go in its section: "
                               f"{', '.join(owners) or 'none'})")
            if not isinstance(value, dict):
                raise _refusal(path, (name, key), f"engine {engine.name}'s section, a mapping of its settings")
            try:
                engine.BoardSettings.model_validate(value)  # type: ignore[union-attr]
            except ValidationError as exc:
                err = exc.errors()[0]
                msg = "unknown field" if err["type"] == "extra_forbidden" else err["msg"].removeprefix("Value error, ")
                raise _refusal(path, (name, key, *err["loc"]), msg) from None


def board_file(path: Path) -> Boards:
    """The board file at ``path``, its engine sections checked each time it is loaded."""
    return Boards(path, check=check_board_file)
