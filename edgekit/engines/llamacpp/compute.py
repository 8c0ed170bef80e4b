"""The compute buffers llama-server allocates beside a model's weights and cache, counted before it starts.

Each llama context (the target's; the assistant's while it drafts) reserves at start the graph of its worst case:
a prompt batch of n_ubatch tokens, every one an output (llama-context.cpp, ``sched_reserve``). What of that
buffer grows with the model and the context:

* the logits, n_ubatch × n_vocab in F32: 512 MiB at Gemma 4's 262,144 tokens, in each context;
* attention over the n_kv cells of the cache (its whole context): with flash attention only its mask
  (F16, n_kv × n_ubatch); without it the scores of every head (F32, n_kv × n_ubatch × n_head) and an F32 mask.
  On Orin edgekit serves a drafter with flash attention off (llama.cpp #24457): the 31B's scores at 262,144
  tokens are 17.7 GB in each of its two contexts.

The rest of the graph (normalised and projected activations of one batch) stays under the runtime allowance
(edgekit.release.memory). The context-dependent part equals what llama-server reports as its ``compute buffer
size`` between two contexts, flash attention on and off (tests/test_larger_models.py)."""

from __future__ import annotations

from collections.abc import Iterable

N_UBATCH = 512  # llama-server's default -ub; edgekit does not change it
F32, F16 = 4, 2


def context_bytes(heads: int, vocab: int, n_kv: int, flash_attn: bool, n_ubatch: int = N_UBATCH) -> int:
    """One context's logits and attention scratch for a model of ``heads`` query heads and ``vocab`` tokens."""
    per_cell = F16 if flash_attn else F32 * heads + F32
    return n_ubatch * (F32 * vocab + per_cell * n_kv)


def cells(ctx: int) -> int:
    """The cells a full-attention layer's cache holds: the context, padded as llama.cpp pads it (256)."""
    return -(-ctx // 256) * 256


def contexts_bytes(models: Iterable[tuple[int, int]], ctx: int, flash_attn: bool) -> int:
    """The target's and the drafter's contexts (each its heads and vocabulary) at ``ctx`` tokens."""
    return sum(context_bytes(heads, vocab, cells(ctx), flash_attn) for heads, vocab in models)
