"""Loss and acceptance from one unrolled batch.

Loss: for each draft step j, KL(target ‖ drafter) of the next-token distributions, averaged over the
rows where step j has a target (t + j within the sequence), summed over steps.

Acceptance (greedy verification, as llama-server and transformers do it at temperature 0): step j of
a round drafted after position t is accepted when the drafter's top token equals the target's top
token at t + j and every earlier step was accepted. It is counted on the target's greedy path only,
replaying the rounds a real decode of those prompts would run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from edgekit.align.teacher import TeacherBatch


@dataclass
class AcceptanceCounts:
    """Per draft position j = 1…K: rounds counted and rounds whose steps 1…j were all accepted."""

    k: int
    rounds: int = 0
    accepted: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.accepted:
            self.accepted = [0] * self.k

    def add(self, other: AcceptanceCounts) -> None:
        self.rounds += other.rounds
        self.accepted = [a + b for a, b in zip(self.accepted, other.accepted, strict=True)]

    def summary(self) -> dict[str, Any]:
        return summarize(self.k, self.rounds, [a / self.rounds if self.rounds else 0.0 for a in self.accepted])


def summarize(k: int, rounds: int, cumulative: list[float]) -> dict[str, Any]:
    """Per-position acceptance (cumulative and conditional), acceptance rate, tokens per verify pass."""
    conditional = [c / p if p else 0.0 for c, p in zip(cumulative, [1.0, *cumulative[:-1]], strict=True)]
    return {
        "k": k,
        "rounds": rounds,
        "cumulative": [round(c, 4) for c in cumulative],  # P(steps 1…j accepted)
        "per_position": [round(c, 4) for c in conditional],  # P(step j accepted | steps < j accepted)
        # llama-server's draft_n_accepted / draft_n when every round drafts K tokens:
        "acceptance_rate": round(sum(cumulative) / k, 4),
        "mean_accepted": round(sum(cumulative), 4),  # accepted draft tokens per round
        "tokens_per_verify": round(1 + sum(cumulative), 4),  # the accepted ones + the target's own token
    }


def valid_rows(batch: TeacherBatch, j: int) -> Any:
    """(B, L) bool: step j of row t has a target distribution (t + j is a real position)."""
    import torch

    t = torch.arange(batch.ids.shape[1], device=batch.ids.device)[None]
    return t + j <= batch.lens[:, None] - 1


def kl_loss(logits: list[Any], batch: TeacherBatch) -> Any:
    import torch

    total = logits[0].new_zeros(())
    for j, q in enumerate(logits, 1):
        rows = valid_rows(batch, j)
        if not bool(rows.any()):
            continue
        lp = torch.roll(batch.logprobs, -j, dims=1)[rows]  # target at t + j: what step j should predict
        lq = torch.log_softmax(q[rows].float(), dim=-1)
        total = total + (lp.exp() * (lp - lq)).sum(-1).mean()
    return total


def centroid_loss(centroid_logits: list[Any], cluster_of: Any, n_clusters: int, batch: TeacherBatch) -> Any:
    """KL(target's mass per centroid ‖ the drafter's centroid softmax), summed over draft steps.

    The ordered head scores only the top-k centroids' tokens: its argmax can only be the target's token
    if that token's centroid ranks high, so the centroids learn where the target's mass is.
    """
    import torch

    total = centroid_logits[0].new_zeros(())
    for j, c in enumerate(centroid_logits, 1):
        rows = valid_rows(batch, j)
        if not bool(rows.any()):
            continue
        p = torch.roll(batch.logprobs, -j, dims=1)[rows].exp()  # (N, V)
        mass = p.new_zeros(p.shape[0], n_clusters).index_add_(1, cluster_of, p).clamp_min(1e-12)
        lq = torch.log_softmax(c[rows].float(), dim=-1)
        total = total + (mass * (mass.log() - lq)).sum(-1).mean()
    return total


def chain_hits(logits: list[Any], batch: TeacherBatch) -> Any:
    """(B, L, K) bool: a round drafted after position t has steps 1…j all accepted (greedy verification)."""
    import torch

    target_top = batch.logprobs.argmax(-1)  # (B, L): the target's greedy token after each position
    chain = torch.roll(batch.ids, -1, dims=1) == target_top  # x_{t+1} must be the target's own token
    out = []
    for j, q in enumerate(logits, 1):
        want = torch.roll(target_top, -j, dims=1)
        chain = chain & (q.argmax(-1) == want)
        out.append(chain)
        # Step j+1 was fed x_{t+j+1}: a real greedy path only if that is the target's top token.
        chain = chain & (torch.roll(batch.ids, -(j + 1), dims=1) == want)
    return torch.stack(out, dim=-1)


def acceptance(logits: list[Any], batch: TeacherBatch) -> AcceptanceCounts:
    """Replay greedy speculative decoding along each greedy continuation, as a server would run it.

    The first round drafts after the last prompt token; a round that keeps m drafts moves on by m + 1
    tokens (the kept drafts and the target's own token). Averaging over every position instead would
    over-count easy stretches, which a real decode crosses in few rounds.
    """
    k = len(logits)
    hits = chain_hits(logits, batch).cpu()
    counts = AcceptanceCounts(k)
    for b in range(batch.ids.shape[0]):
        if not bool(batch.greedy[b]):
            continue
        t, last = int(batch.starts[b]) - 1, int(batch.lens[b]) - 1
        while t + k <= last:  # every draft step has a target token to be checked against
            m = int(hits[b, t].sum())  # chain hits are prefix-closed: their count is the accepted length
            counts.rounds += 1
            for j in range(m):
                counts.accepted[j] += 1
            t += m + 1
    return counts


__all__ = ["AcceptanceCounts", "acceptance", "centroid_loss", "chain_hits", "kl_loss", "summarize",
           "valid_rows"]
