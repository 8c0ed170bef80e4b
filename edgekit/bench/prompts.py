"""Prompt sets: the bundled one (edgekit/data/prompts/<name>.json) or a file of the same shape.

    {"name": "default", "version": 1,
     "categories": {"code": ["...", ...], "qa": [...], "chat": [...], "math": [...], "repetitive": [...]},
     "context": "a long neutral passage, used to pad prompts to a longer context length"}
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from edgekit.errors import EdgekitError

BUNDLED = Path(__file__).resolve().parents[1] / "data" / "prompts"
CATEGORIES = ("code", "qa", "chat", "math", "repetitive")


def path_for(name_or_path: str) -> Path:
    if name_or_path.endswith(".json") or "/" in name_or_path:
        path = Path(name_or_path).expanduser()
    else:
        path = BUNDLED / f"{name_or_path}.json"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in BUNDLED.glob("*.json"))) or "none"
        raise EdgekitError(f"No prompt set {name_or_path!r} (bundled sets: {known}).")
    return path


def load(name_or_path: str) -> dict[str, Any]:
    path = path_for(name_or_path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise EdgekitError(f"The prompt set {path} is not valid JSON ({exc}).") from None
    cats = data.get("categories") if isinstance(data, dict) else None
    if not isinstance(cats, dict) or not any(isinstance(v, list) and v for v in cats.values()):
        raise EdgekitError(f"The prompt set {path} has no prompts under 'categories'.")
    for cat, items in cats.items():
        if not isinstance(items, list) or not all(isinstance(p, str) and p for p in items):
            raise EdgekitError(f"Category {cat!r} of the prompt set {path} must be a list of non-empty strings.")
    return data


def categories(data: dict[str, Any]) -> list[str]:
    return [c for c, items in data["categories"].items() if items]
