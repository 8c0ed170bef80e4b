"""llama.cpp's own settings: a recipe's ``runtime.llama_cpp:`` section (names follow llama-server's flags)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from edgekit.config.printable import PrintableModel
from edgekit.engines.capabilities import read_section

if TYPE_CHECKING:
    from edgekit.config.recipes import Runtime

SECTION = "llama_cpp"
SPEC_TYPES = (
    "none", "draft-simple", "draft-eagle3", "draft-mtp", "draft-dflash", "draft-dspark",
    "ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache",
)  # llama-server's --spec-type values at the pinned ref


# llama-server's KV cache types at the pin (common/arg.cpp: kv_cache_types) and their bytes per element (ggml's
# block sizes: q8_0 keeps 32 values in 34 bytes, q4_0 in 18 …)
KV_BYTES: dict[str, float] = {"f32": 4.0, "f16": 2.0, "bf16": 2.0, "q8_0": 34 / 32, "q4_0": 18 / 32,
                              "q4_1": 20 / 32, "iq4_nl": 18 / 32, "q5_0": 22 / 32, "q5_1": 24 / 32}
KV_TYPES = tuple(KV_BYTES)
UNQUANTIZED = ("f32", "f16", "bf16")


class LlamaCppSettings(PrintableModel):
    model_config = ConfigDict(extra="forbid")

    n_gpu_layers: int = Field(99, ge=0)  # -ngl: the target's layers on the GPU (0 on a board without one)
    n_gpu_layers_draft: int = Field(99, ge=0)  # -ngld: the drafter's
    threads: int | None = Field(None, ge=1, le=1024)  # -t; unset: llama-server's own choice
    slots: bool = False  # llama-server's /slots (each slot's prompt and settings): off unless asked for
    flash_attn: Literal["auto", "on", "off"] = "auto"  # -fa; "auto" passes no flag
    allow_quirks: list[str] = Field(default_factory=list)  # guards (edgekit.engines.llamacpp.quirks) not to apply
    # the KV cache's types (-ctk / -ctv, the drafter's too): q8_0 halves it against f16, q4_0 quarters it; a
    # quantized V cache needs flash attention (llama.cpp refuses it with -fa off)
    cache_type_k: Literal[KV_TYPES] = "f16"  # type: ignore[valid-type]
    cache_type_v: Literal[KV_TYPES] = "f16"  # type: ignore[valid-type]

    @model_validator(mode="after")
    def _v_needs_fa(self) -> LlamaCppSettings:
        if self.cache_type_v not in UNQUANTIZED and self.flash_attn == "off":
            raise ValueError(f"a quantized V cache (cache_type_v: {self.cache_type_v}) needs flash attention, and "
                             "flash_attn is off: llama.cpp refuses that pair")
        return self

    @property
    def kv_type_bytes(self) -> tuple[float, float]:
        """Bytes of one K value and of one V value at these cache types."""
        return KV_BYTES[self.cache_type_k], KV_BYTES[self.cache_type_v]

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
