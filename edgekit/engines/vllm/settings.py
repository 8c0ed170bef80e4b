"""vLLM's own settings: a recipe's ``runtime.vllm:`` section."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal

from pydantic import ConfigDict, Field, field_validator

from edgekit.config.printable import PrintableModel
from edgekit.engines.capabilities import read_section

if TYPE_CHECKING:
    from edgekit.config.recipes import Runtime

SECTION = "vllm"


class VllmSettings(PrintableModel):
    """vLLM's own knobs (engine: vllm); the shared ones (ctx_size, parallel, draft_n_max) are the runtime's."""

    model_config = ConfigDict(extra="forbid")

    gpu_memory_utilization: float = Field(0.85, gt=0.0, le=1.0)  # on CPU: the share of RAM for weights + KV
    # The KV cache in GiB, fixed (--kv-cache-memory-bytes): vLLM then sizes the cache from this, not from
    # gpu_memory_utilization's share of the memory it sees, which differs from machine to machine (on a CPU,
    # a share of the NUMA node: 0.06 of 9.5 GiB is less than the engine itself takes).
    kv_cache_gib: float | None = Field(None, gt=0.0)
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    enforce_eager: bool = False  # no CUDA graphs / torch.compile: starts faster, decodes slower
    text_only: bool = True  # serve the text model alone (Gemma4ForCausalLM): no vision/audio processors
    extra_args: list[str] = Field(default_factory=list)
    # Where vLLM runs: "python" (the board file's vllm.python, else python3), "container" (docker with the
    # NVIDIA runtime, the image below or the board's JetPack line in config/jetpack.py, pinned to the digest
    # the board holds), "auto": container on a board with a GPU driver and no vllm.python, else python.
    runner: Literal["auto", "python", "container"] = "auto"
    image: str | None = None  # e.g. ghcr.io/nvidia-ai-iot/vllm:gemma4-jetson-orin, or repo@sha256:<digest>

    @field_validator("image")
    @classmethod
    def _image(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"[a-z0-9][a-z0-9._/:-]*(@sha256:[0-9a-f]{64})?", v):
            raise ValueError(f"{v!r} is not a container image reference (repo[:tag] or repo@sha256:<64 hex>)")
        return v



class VllmBoardSettings(PrintableModel):
    """What vLLM needs of a board: the board file's ``boards.<name>.vllm:`` section."""

    model_config = ConfigDict(extra="forbid")

    python: str | None = None  # a Python on the board that imports vllm; None → python3


def of(runtime: Runtime | Mapping[str, Any]) -> VllmSettings:
    """Its settings of a recipe's runtime or of a release.json's."""
    return read_section(VllmSettings, SECTION, runtime)
