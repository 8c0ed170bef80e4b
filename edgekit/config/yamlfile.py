"""Load a YAML file into a pydantic model with errors that name the file, the line and the field.

YAML syntax errors report the line PyYAML stopped at; schema errors report the dotted field path
and, where the field exists in the file, its line (found by walking the composed node tree).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from edgekit.errors import EdgekitError

M = TypeVar("M", bound=BaseModel)


def _line_of(node: yaml.Node | None, loc: tuple[Any, ...]) -> int | None:
    """1-based line of the YAML node at ``loc`` (or of its deepest existing parent)."""
    line = node.start_mark.line + 1 if node is not None else None
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            match = next((v for k, v in node.value if getattr(k, "value", None) == str(part)), None)
            if match is None:
                break
            node = match
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            node = node.value[part]
        else:
            break
        line = node.start_mark.line + 1
    return line


def read_yaml(path: Path, what: str) -> tuple[Any, yaml.Node | None]:
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise EdgekitError(f"The {what} {path} does not exist.") from None
    except (IsADirectoryError, PermissionError, UnicodeDecodeError) as exc:
        raise EdgekitError(f"The {what} {path} cannot be read ({exc.__class__.__name__}).") from None
    try:
        data = yaml.safe_load(text)
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise EdgekitError(f"{path}{where}: YAML syntax error: {problem}.") from None
    return data, node


def first_problem(exc: ValidationError) -> tuple[tuple[Any, ...], str]:
    """Where (the field's path) and what (in a sentence's words) of a validation's first problem."""
    err = exc.errors()[0]
    loc = tuple(p for p in err["loc"] if not isinstance(p, str) or not p.startswith("function-"))
    return loc, "unknown field" if err["type"] == "extra_forbidden" else err["msg"].removeprefix("Value error, ")


def validate(model: type[M], data: Any, path: Path, node: yaml.Node | None, what: str) -> M:
    if not isinstance(data, dict):
        raise EdgekitError(f"{path}: the {what} must be a YAML mapping at the top level.")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        loc, msg = first_problem(exc)
        field = ".".join(str(p) for p in loc) or "(top level)"
        line = _line_of(node, loc)
        where = f" line {line}" if line else ""
        more = f" (and {len(exc.errors()) - 1} more problem(s))" if len(exc.errors()) > 1 else ""
        raise EdgekitError(f"{path}{where}: field '{field}': {msg}{more}.".replace("..", ".")) from None


def where_in(path: Path, loc: tuple[Any, ...]) -> str:
    """``<path> line N`` of the value at ``loc`` in a YAML file already loaded (for a later check's sentence)."""
    try:
        line = _line_of(yaml.compose(path.read_text(), Loader=yaml.SafeLoader), loc)
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        line = None
    return f"{path} line {line}" if line else str(path)


def load_model(model: type[M], path: Path, what: str) -> M:
    data, node = read_yaml(path, what)
    return validate(model, data, path, node, what)
