"""The training data: the target's own continuations of the prompts (greedy, plus optional samples)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

GEN_BATCH = 32


@dataclass(frozen=True)
class Continuation:
    tokens: Any  # 1-D LongTensor on CPU: prompt (with BOS) + what the target wrote
    prompt_len: int
    greedy: bool


def _generate(pair: Any, prompts: Sequence[str], new_tokens: int, greedy: bool) -> list[Continuation]:
    import torch

    tok = pair.tokenizer
    tok.padding_side = "left"  # Gemma's RoPE is relative, so left padding leaves the continuation unchanged
    eos = pair.target.generation_config.eos_token_id
    eos_ids = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    out: list[Continuation] = []
    for i in range(0, len(prompts), GEN_BATCH):
        enc = tok(list(prompts[i:i + GEN_BATCH]), return_tensors="pt", padding=True).to(pair.device)
        with torch.no_grad():
            gen = pair.target.generate(**enc, max_new_tokens=new_tokens, do_sample=not greedy,
                                       temperature=None if greedy else 1.0, top_k=None, top_p=None,
                                       pad_token_id=tok.pad_token_id)
        width = enc.input_ids.shape[1]
        for row, mask in zip(gen.cpu(), enc.attention_mask.cpu(), strict=True):
            n_pad = int((mask == 0).sum())
            prompt_len = width - n_pad
            seq = row[n_pad:]
            cut = next((j + 1 for j in range(prompt_len, len(seq)) if int(seq[j]) in eos_ids), len(seq))
            out.append(Continuation(seq[:cut].clone(), prompt_len, greedy))
    return out


def continuations(pair: Any, prompts: Sequence[str], new_tokens: int, sampled: int = 0,
                  seed: int = 0) -> list[Continuation]:
    """Greedy continuations of every prompt, then ``sampled`` temperature-1 samples of each (seeded)."""
    import torch

    data = _generate(pair, prompts, new_tokens, greedy=True)
    if sampled:
        torch.manual_seed(seed)
        for _ in range(sampled):
            data += _generate(pair, prompts, new_tokens, greedy=False)
    return [c for c in data if len(c.tokens) > c.prompt_len]  # a prompt answered by EOS alone teaches nothing


__all__ = ["Continuation", "continuations"]
