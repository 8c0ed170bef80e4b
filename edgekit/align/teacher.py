"""The target's side of distillation: next-token log-probs, last hidden states and the shared KV.

One full forward of the frozen target per sequence gives, for every position, exactly what the drafter
reads at inference (hidden state after the final norm, the KV of the last non-shared layer of each
attention type) and what it must predict (the target's next-token distribution). Small runs keep all
of it in memory; beyond ``budget_bytes`` it is recomputed for each batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from edgekit.align.continuations import Continuation

CHUNK = 16
DEFAULT_BUDGET = 1 << 30


@dataclass
class TeacherBatch:
    ids: Any  # (B, L) long, right-padded
    lens: Any  # (B,) long: real length of each row
    starts: Any  # (B,) long: prompt length (the first drafting row is starts - 1)
    greedy: Any  # (B,) bool: the continuation is the target's greedy path
    logprobs: Any  # (B, L, V) float: log-softmax of the target's logits at each position
    hidden: Any  # (B, L, H) float: the target's last hidden state (after the final norm)
    kv: dict[str, tuple[Any, Any]]  # layer type -> (keys, values), each (B, kv_heads, L, head_dim)


def _forward(pair: Any, seqs: Sequence[Continuation]) -> TeacherBatch:
    import torch
    import torch.nn.functional as F

    lens = torch.tensor([len(s.tokens) for s in seqs])
    width = int(lens.max())
    pad = pair.tokenizer.pad_token_id or 0
    ids = torch.stack([F.pad(s.tokens, (0, width - len(s.tokens)), value=pad) for s in seqs]).to(pair.device)
    with torch.no_grad():
        # Right padding needs no mask: attention is causal, so padding never reaches a real position.
        out = pair.target(input_ids=ids, output_hidden_states=True, return_shared_kv_states=True, use_cache=False)
    kv = {name: (k.float(), v.float()) for name, (k, v) in dict(out.shared_kv_states).items()}
    return TeacherBatch(ids, lens.to(pair.device), torch.tensor([s.prompt_len for s in seqs], device=pair.device),
                        torch.tensor([s.greedy for s in seqs], device=pair.device),
                        torch.log_softmax(out.logits.float(), dim=-1), out.hidden_states[-1].float(), kv)


def _rows(batch: TeacherBatch) -> list[dict[str, Any]]:
    """Split a batch into per-sequence tensors without padding (for the in-memory cache)."""
    rows = []
    for i, n in enumerate(batch.lens.tolist()):
        rows.append({"ids": batch.ids[i, :n], "start": batch.starts[i], "greedy": batch.greedy[i],
                     "logprobs": batch.logprobs[i, :n], "hidden": batch.hidden[i, :n],
                     "kv": {t: (k[i, :, :n], v[i, :, :n]) for t, (k, v) in batch.kv.items()}})
    return rows


def _collate(rows: Sequence[dict[str, Any]], pad: int) -> TeacherBatch:
    import torch
    import torch.nn.functional as F

    lens = torch.tensor([len(r["ids"]) for r in rows], device=rows[0]["ids"].device)
    width = int(lens.max())

    def pad_rows(t: Any, value: float = 0.0) -> Any:  # pad the sequence dimension (dim 0) to ``width``
        return F.pad(t, (0, 0) * (t.dim() - 1) + (0, width - t.shape[0]), value=value)

    kv = {}
    for t in rows[0]["kv"]:
        ks = [r["kv"][t][0] for r in rows]
        vs = [r["kv"][t][1] for r in rows]
        kv[t] = (torch.stack([F.pad(k, (0, 0, 0, width - k.shape[1])) for k in ks]),
                 torch.stack([F.pad(v, (0, 0, 0, width - v.shape[1])) for v in vs]))
    return TeacherBatch(torch.stack([pad_rows(r["ids"], pad) for r in rows]), lens,
                        torch.stack([r["start"] for r in rows]), torch.stack([r["greedy"] for r in rows]),
                        torch.stack([pad_rows(r["logprobs"]) for r in rows]),
                        torch.stack([pad_rows(r["hidden"]) for r in rows]), kv)


class Teacher:
    """Teacher outputs for a fixed list of sequences, by index."""

    def __init__(self, pair: Any, seqs: Sequence[Continuation], budget_bytes: int = DEFAULT_BUDGET) -> None:
        self.pair, self.seqs = pair, list(seqs)
        self.pad = pair.tokenizer.pad_token_id or 0
        self._rows: list[dict[str, Any]] | None = None
        if self.estimate_bytes() <= budget_bytes:
            self._rows = []
            for i in range(0, len(self.seqs), CHUNK):
                self._rows += _rows(_forward(pair, self.seqs[i:i + CHUNK]))

    def estimate_bytes(self) -> int:
        text = self.pair.target.config.get_text_config()
        per_token = text.vocab_size + text.hidden_size + 4 * 2 * 512  # log-probs, hidden, generous KV bound
        return 4 * per_token * sum(len(s.tokens) for s in self.seqs)

    def __len__(self) -> int:
        return len(self.seqs)

    def batch(self, indices: Sequence[int]) -> TeacherBatch:
        if self._rows is not None:
            return _collate([self._rows[i] for i in indices], self.pad)
        return _forward(self.pair, [self.seqs[i] for i in indices])


__all__ = ["Teacher", "TeacherBatch"]
