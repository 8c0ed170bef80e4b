"""Names that end up in paths and remote commands: one strict shape, checked once."""

from __future__ import annotations

import re

from edgekit.errors import EdgekitError

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def check_name(value: str, what: str) -> str:
    """Board, recipe and group names become file names and unit names: letters, digits, . _ -."""
    if not isinstance(value, str) or not _NAME.match(value) or ".." in value:
        raise ValueError(
            f"{what} {value!r} is not a valid name (use letters, digits, '.', '_' or '-', "
            "starting with a letter or digit, at most 64 characters)"
        )
    return value


def require_name(value: str, what: str) -> str:
    try:
        return check_name(value, what)
    except ValueError as exc:
        raise EdgekitError(str(exc)[0].upper() + str(exc)[1:] + ".") from None
