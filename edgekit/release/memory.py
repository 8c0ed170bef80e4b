"""What a release needs of a board's memory, estimated before a byte is sent: its models' weights, its KV cache
at the recipe's context (the engine says how big: ``EngineBase.kv_cache_bytes``) and the runtime around them.
A floor, not a promise: a server that needs more still fails its health check and the board goes back."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from edgekit.models.footprint import KvBytes
from edgekit.release.plan import ReleasePlan

RUNTIME_MB = 300.0  # the server's own code, threads and what of its compute buffers is not counted apart
SLACK = 0.05  # of weights and cache: alignment, allocator rounding


@dataclass(frozen=True)
class MemoryNeed:
    weights_mb: float
    kv_mb: float
    compute_mb: float = 0.0  # the engine's scratch where it says (EngineBase.compute_bytes_of): logits, attention

    @property
    def runtime_mb(self) -> float:
        return RUNTIME_MB + SLACK * (self.weights_mb + self.kv_mb)

    @property
    def total_mb(self) -> float:
        return self.weights_mb + self.kv_mb + self.compute_mb + self.runtime_mb

    def describe(self) -> str:
        compute = f", compute buffers {self.compute_mb:.0f} MB" if self.compute_mb else ""
        return (f"≈ {self.total_mb:.0f} MB (models {self.weights_mb:.0f} MB, KV cache {self.kv_mb:.0f} MB{compute}, "
                f"runtime {self.runtime_mb:.0f} MB)")


def models_mb(files: dict[str, int]) -> float:
    """The release's models (path in the release → size): what its server holds in memory."""
    return sum(size for rel, size in files.items() if rel.startswith("models/")) / 1e6


def need_of(plan: ReleasePlan, kv_bytes: int, compute_bytes: int = 0) -> MemoryNeed:
    return MemoryNeed(models_mb({rel: b.size for rel, b in plan.files.items()}), kv_bytes / 1e6, compute_bytes / 1e6)


def kv_fields(kv: KvBytes) -> dict[str, Any]:
    """What release.json says of its cache: ``kv_layout`` (full and sliding layers apart) and, for the readers of
    older releases, ``kv_bytes_per_token`` as every layer at full length."""
    return {"kv_layout": kv.to_dict(), "kv_bytes_per_token": kv.per_token_upper}


def kv_of_manifest(manifest: dict[str, Any]) -> KvBytes | None:
    """A release.json's cache per token (an older release's loose bound as all full layers; None: not recorded)."""
    if isinstance(layout := manifest.get("kv_layout"), dict):
        return KvBytes(int(layout.get("full_per_token") or 0), int(layout.get("swa_per_token") or 0),
                       int(layout.get("window") or 0))
    per_token = manifest.get("kv_bytes_per_token")
    return KvBytes(int(per_token), 0, 0) if per_token else None
