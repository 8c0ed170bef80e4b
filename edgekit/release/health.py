"""The health result every engine's check returns, and what a CUDA build's server log says about the GPU."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Literal

HEALTH_PROMPT = "The three primary colours are"
# What the server must do with the GPU: "none" (a CPU build), "required" (a CUDA build on a board with
# a GPU driver: a CPU fallback is a failed deploy), "optional" (a CUDA build on a board without one, an
# emulated board: the fallback is reported, plainly).
GpuPolicy = Literal["none", "required", "optional"]
# ggml-cuda's first words at start-up (the last start's line wins; the log is appended to).
CUDA_INIT = re.compile(r"ggml_cuda_init: (found (\d+) CUDA devices?|failed to initialize CUDA: [^\n]*)")


@dataclass
class Health:
    ok: bool
    reason: str
    seconds_to_ready: float | None = None
    tokens: int = 0
    tokens_per_second: float | None = None
    draft_n: int | None = None
    draft_n_accepted: int | None = None
    text: str = ""
    # "completion" / "chat completion" (through the model's chat template): measured now; "recorded": /health
    # now, figures from activation
    method: str = "completion"
    gpu: str | None = None  # CUDA builds: "used (N CUDA devices)" or "not used: <why>"; CPU builds: None
    media: dict[str, dict] | None = None  # per kind ("image", "audio"): TTFT and tok/s of one chat request

    @property
    def acceptance(self) -> float | None:
        if not self.draft_n:
            return None
        return (self.draft_n_accepted or 0) / self.draft_n

    def to_dict(self) -> dict[str, object]:
        data = asdict(self)
        data["acceptance"] = self.acceptance
        return data


def gpu_use(log_text: str) -> tuple[bool, str]:
    """Did the (last) server start find a CUDA device? From ggml-cuda's start-up line in its log."""
    found = CUDA_INIT.findall(log_text)
    if not found:
        return False, "not used: the server log has no CUDA start-up line"
    line, count = found[-1]
    if count and int(count) > 0:
        return True, f"used ({count} CUDA device{'s' if int(count) > 1 else ''})"
    return False, f"not used: {line.removeprefix('failed to initialize CUDA: ') or line}; the server runs on the CPU"


def apply_gpu_policy(health: Health, policy: GpuPolicy, log_text: str) -> Health:
    if policy == "none" or not health.ok:
        return health
    used, health.gpu = gpu_use(log_text)
    if not used and policy == "required":
        health.ok, health.reason = False, f"the GPU was {health.gpu}"
    return health
