"""Training checkpoints: the drafter's master weights, the optimizer, the step and the history.

One file per run directory, replaced atomically, tagged with the run's store key so a checkpoint is
only ever resumed by the same run (same target, drafter, data and settings).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgekit.errors import EdgekitError

FILE = "checkpoint.pt"


@dataclass(frozen=True)
class Checkpointer:
    directory: Path
    key: str

    @property
    def path(self) -> Path:
        return self.directory / FILE

    def save(self, step: int, drafter: Any, optimizer: Any, history: list[dict[str, Any]]) -> None:
        import torch

        self.directory.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        torch.save({"key": self.key, "step": step, "drafter": drafter.state_dict(),
                    "optimizer": optimizer.state_dict(), "history": history}, tmp)
        os.replace(tmp, self.path)  # a kill mid-write leaves the previous checkpoint intact

    def load(self) -> dict[str, Any] | None:
        import torch

        if not self.path.is_file():
            return None
        try:
            state = torch.load(self.path, map_location="cpu", weights_only=True)
        except Exception as exc:  # any unreadable file: say which, and how to start over
            raise EdgekitError(f"The alignment checkpoint {self.path} cannot be read ({exc}); delete it to start "
                               "over.") from None
        return state if state.get("key") == self.key else None

    def clear(self) -> None:
        for p in (self.path, self.path.with_suffix(".tmp")):
            p.unlink(missing_ok=True)


__all__ = ["Checkpointer"]
