"""The drafter's K draft steps for every position of a batch at once, as llama.cpp's draft-mtp runs them.

At inference (llama.cpp ``common_speculative_impl_draft_mtp``, transformers
``SinglePositionMultiTokenCandidateGenerator``) a drafting round after position t reads:

- step 1: [target_embed(x_{t+1}), h_t] where h_t is the target's last hidden state (after the final norm);
- step j>1: [target_embed(d_{j-1}), the drafter's own post-projected state from step j-1];
- always at position t+1, attending to the target's shared KV for positions 0…t only.

Step j is only kept if steps 1…j-1 matched the target, so training feeds step j the target's token
x_{t+j} (teacher forcing) and row t of every step is trained in one batched pass: row t's query sits
at position t+1 and its mask shows KV 0…t (and, for sliding layers, llama.cpp's window: positions
p with (t+1) - p < sliding_window).
"""

from __future__ import annotations

from typing import Any

from edgekit.align.teacher import TeacherBatch


def draft_masks(batch: int, length: int, sliding_window: int | None, device: Any) -> dict[str, Any]:
    """Boolean masks (True = attend) for rows t = 0…L-1 over KV positions 0…L-1."""
    import torch

    t = torch.arange(length, device=device)[:, None]
    p = torch.arange(length, device=device)[None, :]
    full = p <= t
    sliding = full & (p >= t + 2 - sliding_window) if sliding_window else full
    return {"full_attention": full[None, None].expand(batch, 1, length, length),
            "sliding_attention": sliding[None, None].expand(batch, 1, length, length)}


def shifted(ids: Any, j: int, pad: int) -> Any:
    """ids[:, t + j] at row t (pad past the end)."""
    import torch.nn.functional as F

    return F.pad(ids[:, j:], (0, j), value=pad)


def unroll(drafter: Any, embed: Any, batch: TeacherBatch, k: int, pad: int = 0) -> list[Any]:
    """Dense drafter logits (B, L, V) for draft steps 1…k; row t of step j predicts the token at t + j + 1."""
    return [drafter.lm_head(last) for last in unroll_states(drafter, embed, batch, k, pad)]


def has_ordered_head(drafter: Any) -> bool:
    return getattr(drafter, "masked_embedding", None) is not None


def head_logits(drafter: Any, last: Any, head: str) -> Any:
    """The drafter's logits from its last hidden state, as an engine computes them.

    ``dense``: the full tied head (what llama.cpp runs for a GGUF without the ordered embeddings);
    ``ordered``: transformers' centroid-masked head, what llama.cpp (edgekit's patch 0002), vLLM and edgekit's
    LiteRT-LM bundle run.
    """
    if head == "ordered" and has_ordered_head(drafter):
        return drafter.masked_embedding(last, drafter.lm_head.weight)
    return drafter.lm_head(last)


def unroll_states(drafter: Any, embed: Any, batch: TeacherBatch, k: int, pad: int = 0) -> list[Any]:
    """The drafter's last hidden states (B, L, H) for draft steps 1…k (before any head)."""
    import torch

    b, length = batch.ids.shape
    text = drafter.config.get_text_config()
    masks = draft_masks(b, length, getattr(text, "sliding_window", None), batch.ids.device)
    positions = (torch.arange(length, device=batch.ids.device) + 1)[None].expand(b, length)
    state = batch.hidden
    states = []
    for j in range(1, k + 1):
        x = torch.cat([embed(shifted(batch.ids, j, pad)), state], dim=-1)
        out = drafter.model(inputs_embeds=drafter.pre_projection(x), attention_mask=masks, position_ids=positions,
                            shared_kv_states=dict(batch.kv), use_cache=False,
                            logits_to_keep=None)  # None: keep every row through the KV-shared layers
        last = out.last_hidden_state
        states.append(last)
        state = drafter.post_projection(last)
    return states


__all__ = ["draft_masks", "has_ordered_head", "head_logits", "shifted", "unroll", "unroll_states"]
