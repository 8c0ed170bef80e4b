"""Values that reach the board are printable: checked once, as a recipe or a board file is loaded.

A recipe's or a board file's strings end up in systemd units (Environment=, ExecStart=), in command lines run
over SSH and in files on the board. systemd quoting does not survive a control character: a newline in
``runtime.env`` or ``runtime.extra_args`` would add lines of its own to the unit. So every string of such a
model, keys included, must be printable (``str.isprintable()``: no \\n, \\r, \\t, NUL, \\x0b, \\x0c, \\x1c-\\x1e,
U+0085, U+2028/U+2029 …), except a field marked ``FREE_TEXT``, which never leaves the workstation (a recipe's
description may span lines).

Models take the check from :class:`PrintableModel`: it walks the input before any field is validated, so the
sentence names the field with its whole path (``runtime.env.GGML_X``, ``runtime.extra_args[1]``) whatever else
is wrong with it. The loaders (``load_recipe``, ``Boards.load``) put the file in front of the sentence.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, model_validator

from edgekit.errors import EdgekitError

FREE_TEXT = "edgekit: free text"  # Annotated[..., FREE_TEXT]: a field whose strings are not checked


class UnprintableValue(EdgekitError):
    """A value that would reach the board holds a control character. Not a ValueError, so pydantic lets it
    through as it is (with its path) rather than folding it into a ValidationError."""

    def __init__(self, field: str, char: str, where: str = "") -> None:
        self.field, self.char, self.where = field, char, where
        prefix = f"{where}: " if where else ""
        super().__init__(f"{prefix}{field} holds a control character (U+{ord(char):04X}); "
                         "values that reach the board must be printable.")

    def within(self, where: str) -> UnprintableValue:
        """The same sentence, saying which file (e.g. ``recipe my.yaml``)."""
        return UnprintableValue(self.field, self.char, where)


def shown(text: str) -> str:
    """``text`` with its unprintable characters escaped (\\n, \\x00, \\u2028), fit for a one-line sentence."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


def first_unprintable(text: str) -> str | None:
    return next((c for c in text if not c.isprintable()), None)


def _as_text(value: object) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, bytes | bytearray):  # pydantic turns bytes (YAML !!binary) into a str field's text
        return bytes(value).decode("utf-8", "replace")
    return None


def _submodel(annotation: Any) -> type[BaseModel] | None:
    """The model a field holds directly (``Runtime``, ``ModelSource | None``); None for containers and scalars."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        models = [m for m in map(_submodel, typing.get_args(annotation)) if m is not None]
        return models[0] if len(models) == 1 else None
    return None


def check_printable(value: Any, model: type[BaseModel] | None = None, path: str = "") -> None:
    """Raise :class:`UnprintableValue` for the first string in ``value`` (keys too) that holds a control
    character. ``model``: the model ``value`` is the input of, whose ``FREE_TEXT`` fields are left out (as are
    those of the models its fields hold directly; a model inside a list or a dict is checked whole)."""
    text = _as_text(value)
    if text is not None:
        bad = first_unprintable(text)
        if bad is not None:
            raise UnprintableValue(path or "(top level)", bad)
    elif isinstance(value, Mapping):
        for key, item in value.items():
            name = _as_text(key)
            segment = shown(name if name is not None else str(key))
            at = f"{path}.{segment}" if path else segment
            if name is not None and (bad := first_unprintable(name)) is not None:
                raise UnprintableValue(at, bad)
            field = model.model_fields.get(name) if model is not None and name is not None else None
            if field is not None and FREE_TEXT in field.metadata:
                continue
            check_printable(item, _submodel(field.annotation) if field is not None else None, at)
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            check_printable(item, None, f"{path}[{i}]")


class PrintableModel(BaseModel):
    """A model whose every string (but ``FREE_TEXT`` fields') must be printable: checked on its raw input,
    before its fields, so the outermost such model names the field by its whole path."""

    @model_validator(mode="before")
    @classmethod
    def _printable(cls, data: Any) -> Any:
        check_printable(data, cls)
        return data
