"""The checkpoint as transformers runs it, as a reference llama-perplexity can compare any GGUF with.

``llama-perplexity --kl-divergence-base FILE`` writes a base file (the tokens of every window and, per
scored position, the base model's log-probabilities, compressed to 16 bits) and ``--kl-divergence`` reads it
back to score another model on the same tokens. This module reads the tokens of a base file that llama.cpp
wrote, runs the checkpoint in transformers (float32) on exactly those windows — the first token of each made
BOS, as llama-perplexity does — and writes a base file of the same format with transformers'
log-probabilities. Scoring a GGUF against it measures the conversion *and* the runtime against the model as
published: a GGUF whose RoPE, MLP width or head differs from the checkpoint's cannot pass.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import numpy as np

from edgekit.errors import EdgekitError

MAGIC = b"_logits_"


def read_base(path: Path) -> tuple[int, int, int, np.ndarray]:
    """(n_ctx, n_vocab, n_chunk, tokens (n_chunk, n_ctx)) of a llama-perplexity base file."""
    with open(path, "rb") as fh:
        if fh.read(8) != MAGIC:
            raise EdgekitError(f"{path} is not a llama-perplexity log-probability file.")
        n_ctx, n_vocab, n_chunk = struct.unpack("<Iii", fh.read(12))
        tokens = np.frombuffer(fh.read(4 * n_ctx * n_chunk), dtype="<i4").reshape(n_chunk, n_ctx)
    return n_ctx, n_vocab, n_chunk, tokens


def compress_rows(logits: np.ndarray) -> np.ndarray:
    """Rows of logits → llama-perplexity's stored form: per row float32 scale and min log-prob, then one
    uint16 per token (log-probs within 16 nats of the top, the rest 0), padded as it pads them."""
    rows, n_vocab = logits.shape
    nv = 2 * ((n_vocab + 1) // 2) + 4
    out = np.zeros((rows, nv), dtype=np.uint16)
    x = logits.astype(np.float32)
    max_logit = x.max(axis=1, keepdims=True)
    min_logit = np.maximum(x.min(axis=1, keepdims=True), max_logit - 16)
    log_sum_exp = np.log(np.exp((x - max_logit).astype(np.float64)).sum(axis=1, keepdims=True)).astype(np.float32)
    min_log_prob = min_logit - max_logit - log_sum_exp
    scale = (max_logit - min_logit) / np.float32(65535.0)
    head = np.concatenate([scale, min_log_prob], axis=1).astype("<f4")
    out[:, :4] = head.view(np.uint16)
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(x > min_logit, np.rint((x - min_logit) / np.where(scale > 0, scale, 1)), 0)
    out[:, 4:4 + n_vocab] = np.where(scale > 0, q, 0).astype(np.uint16)
    return out


def write_transformers_base(model_dir: Path, architecture: str, llama_base: Path, out: Path,
                            threads: int = 2) -> dict[str, Any]:
    """A base file with transformers' log-probs on the windows of ``llama_base`` (written by llama.cpp)."""
    import torch
    import transformers
    from transformers import AutoTokenizer

    from edgekit.models.hfcompat import patch_transformers

    patch_transformers()
    n_ctx, n_vocab, n_chunk, tokens = read_base(llama_base)
    tok = AutoTokenizer.from_pretrained(model_dir)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        model = getattr(transformers, architecture).from_pretrained(model_dir, dtype=torch.float32).eval()
        vocab = model.config.get_text_config().vocab_size
        if vocab != n_vocab:
            raise EdgekitError(f"The GGUF has a vocabulary of {n_vocab} tokens and the checkpoint {model_dir.name} "
                               f"one of {vocab}: they are not the same model.")
        first = n_ctx // 2
        # Whether the tokenizer starts a text with BOS (its post-processor; ``add_bos_token`` can say False).
        bos = tok.bos_token_id if tok("a").input_ids[:1] == [tok.bos_token_id] else None
        with open(llama_base, "rb") as src, open(out, "wb") as fh:
            fh.write(src.read(8 + 12 + 4 * n_ctx * n_chunk))  # same header and tokens
            for chunk in tokens:
                ids = torch.tensor(chunk, dtype=torch.long)[None].clone()
                if bos is not None:
                    ids[0, 0] = bos  # as llama-perplexity makes the first token of each window
                with torch.no_grad():
                    logits = model(input_ids=ids).logits[0, first:n_ctx - 1].float().numpy()
                fh.write(compress_rows(logits).tobytes())
    finally:
        torch.set_num_threads(before)
    return {"windows": n_chunk, "ctx": n_ctx, "scored_per_window": n_ctx - 1 - first,
            "reference": f"transformers {transformers.__version__} {architecture}, float32"}


__all__ = ["compress_rows", "read_base", "write_transformers_base"]
