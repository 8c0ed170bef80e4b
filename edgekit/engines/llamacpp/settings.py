"""llama.cpp's own settings: a recipe's ``runtime.llama_cpp:`` section (names follow llama-server's flags)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal

from pydantic import ConfigDict, Field, field_validator

from edgekit.config.printable import PrintableModel
from edgekit.engines.capabilities import read_section

if TYPE_CHECKING:
    from edgekit.config.recipes import Runtime

SECTION = "llama_cpp"
SPEC_TYPES = (
    "none", "draft-simple", "draft-eagle3", "draft-mtp", "draft-dflash", "draft-dspark",
    "ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache",
)  # llama-server's --spec-type values at the pinned ref


class LlamaCppSettings(PrintableModel):
    model_config = ConfigDict(extra="forbid")

    n_gpu_layers: int = Field(99, ge=0)  # -ngl: the target's layers on the GPU (0 on a board without one)
    n_gpu_layers_draft: int = Field(99, ge=0)  # -ngld: the drafter's
    threads: int | None = Field(None, ge=1, le=1024)  # -t; unset: llama-server's own choice
    slots: bool = False  # llama-server's /slots (each slot's prompt and settings): off unless asked for
    flash_attn: Literal["auto", "on", "off"] = "auto"  # -fa; "auto" passes no flag
    allow_quirks: list[str] = Field(default_factory=list)  # guards (edgekit.engines.llamacpp.quirks) not to apply

    @field_validator("flash_attn", mode="before")
    @classmethod
    def _words(cls, v: object) -> object:
        # YAML 1.1 reads a bare `flash_attn: off` as false (and `on` as true): take the words as written.
        return {False: "off", True: "on"}.get(v, v) if isinstance(v, bool) else v


def of(runtime: Runtime | Mapping[str, Any]) -> LlamaCppSettings:
    """llama.cpp's settings of a recipe's runtime or of a release.json's."""
    return read_section(LlamaCppSettings, SECTION, runtime)


def changed(runtime: Runtime, **changes: Any) -> Runtime:
    """The runtime with some of llama.cpp's settings changed (a guard's fix)."""
    return runtime.model_copy(update={SECTION: {**of(runtime).model_dump(mode="json"), **changes}})
