"""What an alignment run is: the settings a recipe's ``drafter.align`` block (or the CLI) gives.

Pydantic only, no torch: part of the recipe schema (config), which align reads.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class AlignSpec(BaseModel):
    """Settings of one alignment run; all are part of the aligned drafter's store key (``data`` by content)."""

    model_config = ConfigDict(extra="forbid")

    steps: int = Field(300, ge=1, le=10_000_000)
    seed: int = Field(0, ge=0)
    data: str = "default"  # "default" (bundled prompts) or a prompt file, one prompt per line
    k: int | None = Field(None, ge=1, le=16)  # draft positions t+1…t+K; None: the recipe's runtime.draft_n_max
    lr: float = Field(1e-4, gt=0, le=1.0)  # re-fitting a trained assistant; a random one wants ~1e-2
    batch_size: int = Field(16, ge=1, le=4096)
    new_tokens: int = Field(48, ge=4, le=4096)  # tokens the target writes after each prompt
    sampled: int = Field(0, ge=0, le=64)  # extra sampled (temperature 1) continuations per training prompt
    qat: Literal["auto", "on", "off"] = "auto"  # keep weights on the Q4_0 grid; auto: those that are on it

    def with_overrides(self, **values: Any) -> AlignSpec:
        """A copy with the given (non-None) settings replaced, validated again (CLI flags over the recipe)."""
        data = self.model_dump()
        data.update({k: v for k, v in values.items() if v is not None})
        return AlignSpec.model_validate(data)


__all__ = ["AlignSpec"]
