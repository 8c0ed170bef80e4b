"""The published Gemma 4 configs edgekit ships (``edgekit/data/gemma4-configs``, structure only, no weights), and
which of them a Hugging Face repo id names: a recipe's memory is known before a byte of it is downloaded."""

from __future__ import annotations

import json
import re
from importlib import resources

# google/gemma-4-31B-it, …-it-assistant, …-it-qat-q4_0-unquantized(-assistant): the QAT checkpoints have the
# structure of the model they were trained from.
_REPO = re.compile(r"^google/(gemma-4-[^/]+?-it)(?:-qat-[a-z0-9_]+-unquantized)?(-assistant)?$")


def published_config(name: str) -> dict:
    """One of the published configs edgekit ships (``gemma-4-E2B-it``, ``gemma-4-E2B-it-assistant`` …)."""
    data = resources.files("edgekit").joinpath(f"data/gemma4-configs/{name}.config.json").read_text()
    return json.loads(data)


def config_name_of_repo(repo: str) -> str | None:
    """The shipped config a published repo id has the structure of (``None``: not one edgekit ships)."""
    m = _REPO.match(repo)
    if not m:
        return None
    name = m.group(1) + (m.group(2) or "")
    return name if resources.files("edgekit").joinpath(f"data/gemma4-configs/{name}.config.json").is_file() else None
