"""LiteRT-LM's own settings: a recipe's ``runtime.litert:`` section."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal

from pydantic import ConfigDict

from edgekit.config.printable import PrintableModel
from edgekit.engines.capabilities import read_section

if TYPE_CHECKING:
    from edgekit.config.recipes import Runtime

SECTION = "litert"


class LitertSettings(PrintableModel):
    """LiteRT-LM's own knobs (engine: litert-lm); its context is the bundle's KV cache (convert.litert_cache_length)."""

    model_config = ConfigDict(extra="forbid")

    accelerator: Literal["cpu", "gpu"] = "cpu"  # LiteRT-LM's backend (gpu: its GPU delegate, where it has one)



class LitertBoardSettings(PrintableModel):
    """What LiteRT-LM needs of a board: the board file's ``boards.<name>.litert:`` section."""

    model_config = ConfigDict(extra="forbid")

    python: str | None = None  # a Python on the board that imports litert_lm; None → python3


def of(runtime: Runtime | Mapping[str, Any]) -> LitertSettings:
    """Its settings of a recipe's runtime or of a release.json's."""
    return read_section(LitertSettings, SECTION, runtime)
