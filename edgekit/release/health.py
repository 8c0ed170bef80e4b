"""The health result of a release's server, as the board-side check (the agent's `health` verb,
edgekit/agent/health.py) prints it."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, Literal

from edgekit.agent.health import HEALTH_PROMPT

# What the server must do with the GPU: "none" (a CPU build), "required" (a CUDA build on a board with
# a GPU driver: a CPU fallback is a failed deploy), "optional" (a CUDA build on a board without one, an
# emulated board: the fallback is reported, plainly). The board-side check applies it (agent/health.py).
GpuPolicy = Literal["none", "required", "optional"]


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

    @classmethod
    def of_dict(cls, data: dict[str, Any]) -> Health:
        """A Health as printed by the board's check (or recorded beside a release): unknown fields are dropped."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


__all__ = ["HEALTH_PROMPT", "GpuPolicy", "Health"]
