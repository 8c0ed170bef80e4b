"""`state`: a board's release state in one answer, as the fleet's plays read it before they act.

    state BASE [--release R] [--unit U [--older NAME]...]

current, serving and the releases (oldest first, as board_releases orders them); the one before current
(previous); whether R is among them; the releases that carry the activation program (agent/activate.py: an older
edgekit's release may not); the manifests (release.json, less its file list) of current, previous and R; whether
U, or it under an older name, is active; and the prefix a root command takes here (privileged.py). BASE may start
with ``~`` (the board file's default); the answer's ``base`` is absolute, for every command after it.
"""

from __future__ import annotations

import json
import os
from typing import Any

from .board_releases import Layout
from .units import Units


def _manifest(lay: Layout, rid: str | None) -> dict[str, Any]:
    if not rid:
        return {}
    try:
        with open(lay.path("releases", rid, "release.json")) as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    data.pop("files", None)  # hundreds of entries no play reads
    return data


def state(base: str, release: str = "", unit: str = "", older: list[str] | None = None) -> dict[str, Any]:
    lay = Layout(os.path.expanduser(base))
    units = Units()
    ids, current = lay.releases(), lay.current
    previous = lay.previous()
    names = [unit, *(older or [])] if unit else []
    return {
        "base": lay.base, "current": current, "serving": lay.serving, "releases": ids, "previous": previous,
        "has_release": bool(release) and release in ids,
        "active": any(units.active(name) for name in names),
        "sudo": units.sudo,
        "programs": [r for r in ids if os.path.isfile(lay.path("releases", r, "agent", "activate.py"))],
        "manifests": {"current": _manifest(lay, current), "previous": _manifest(lay, previous),
                      "release": _manifest(lay, release)},
    }
