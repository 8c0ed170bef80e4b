"""An assistant's GGUF without its ordered-embedding head: what llama.cpp drafts with when the centroids are gone.

edgekit's llama.cpp (patch 0002) drafts with the ordered head whenever the GGUF says how many centroids it has;
this copy drops that key, its top-k and the two tensors, so the same weights draft with the full tied head.
Benchmarks put the two heads side by side with it (``benchmarks/ordered_head.py``).
"""

from __future__ import annotations

from pathlib import Path

from edgekit.convert.gguf_io import GGUFFile, write_gguf
from edgekit.errors import EdgekitError

HEAD_TENSORS = ("masked_embd_centroids.weight", "masked_embd_ordering")
HEAD_KEYS = ("masked_embd.centroid_count", "masked_embd.centroid_top_k")  # under the GGUF's architecture


def without_ordered_head(src: Path, out: Path) -> Path:
    """Copy ``src`` to ``out`` without the ordered head (tensors and keys); every other byte as it was."""
    gguf = GGUFFile(src)
    keys = [f"{gguf.arch}.{k}" for k in HEAD_KEYS]
    if not any(gguf.get(k) is not None for k in keys):
        raise EdgekitError(f"{src} has no ordered-embedding head to drop.")
    kept = [t for t in gguf.tensors if t.name not in HEAD_TENSORS]
    write_gguf(out, gguf, [(t.name, t.ne, t.type) for t in kept], (gguf.data(t) for t in kept), drop_keys=keys)
    return out


__all__ = ["HEAD_KEYS", "HEAD_TENSORS", "without_ordered_head"]
