"""The training loop: AdamW on the drafter's weights only, checkpointed, resumable, seeded.

Determinism: batches are drawn from (seed, step) alone and the schedule depends on the step alone, so
a run resumed from a checkpoint takes exactly the steps an uninterrupted one would.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from edgekit.align import grid
from edgekit.align.checkpoint import Checkpointer
from edgekit.align.objective import AcceptanceCounts, acceptance, centroid_loss, kl_loss
from edgekit.align.teacher import Teacher
from edgekit.align.unroll import has_ordered_head, head_logits, unroll_states

EVAL_CHUNK = 16


@dataclass(frozen=True)
class TrainConfig:
    steps: int
    k: int
    lr: float
    batch_size: int
    seed: int
    qat_params: tuple[str, ...] = ()  # matrices kept on the Q4_0 grid
    eval_every: int = 25
    checkpoint_every: int = 25
    clip: float = 1.0


@dataclass
class StepReport:
    step: int
    total: int
    loss: float
    heldout: dict[str, Any] | None  # acceptance summary when this step was evaluated
    resumed_from: int


@dataclass
class TrainResult:
    steps: int
    resumed_from: int
    seconds: float
    history: list[dict[str, Any]] = field(default_factory=list)


def batch_indices(seed: int, step: int, n: int, size: int) -> list[int]:
    return random.Random(f"{seed}:{step}").sample(range(n), min(size, n))


def lr_at(step: int, steps: int, lr: float) -> float:
    """Linear warm-up over the first 5% of steps, then cosine decay to a tenth."""
    warmup = max(1, steps // 20)
    if step < warmup:
        return lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def evaluate(pair: Any, drafter: Any, teacher: Teacher, k: int, head: str = "dense") -> AcceptanceCounts:
    """Greedy acceptance per draft position on ``teacher``'s sequences (held-out continuations), with the
    drafter's ``head`` (:func:`~edgekit.align.unroll.head_logits`)."""
    import torch

    counts = AcceptanceCounts(k)
    pad = pair.tokenizer.pad_token_id or 0
    with torch.no_grad():
        for i in range(0, len(teacher), EVAL_CHUNK):
            batch = teacher.batch(range(i, min(i + EVAL_CHUNK, len(teacher))))
            states = unroll_states(drafter, pair.embed, batch, k, pad)
            counts.add(acceptance([head_logits(drafter, s, head) for s in states], batch))
    return counts


def _loss(drafter: Any, pair: Any, batch: Any, k: int, pad: int) -> Any:
    """KL on the dense head (the ordered head's logits are the same on the tokens it scores), plus, for an
    ordered head, the centroids' KL (which tokens it scores)."""
    states = unroll_states(drafter, pair.embed, batch, k, pad)
    loss = kl_loss([drafter.lm_head(s) for s in states], batch)
    if has_ordered_head(drafter):
        embedder = drafter.masked_embedding
        cluster_of = cluster_index(embedder.token_ordering, embedder.num_centroids)
        loss = loss + centroid_loss([embedder.centroids(s) for s in states], cluster_of, embedder.num_centroids, batch)
    return loss


def cluster_index(token_ordering: Any, n_clusters: int) -> Any:
    """(V,) long: the centroid each token belongs to (``token_ordering`` lists the tokens centroid by centroid)."""
    import torch

    order = token_ordering.long()
    out = torch.empty_like(order)
    out[order] = torch.arange(order.numel(), device=order.device) // (order.numel() // n_clusters)
    return out


def train(pair: Any, teacher: Teacher, heldout: Teacher, cfg: TrainConfig, ckpt: Checkpointer,
          on_step: Callable[[StepReport], None] = lambda _r: None) -> TrainResult:
    import torch

    drafter = pair.drafter
    drafter.eval()  # no dropout anywhere in the drafter; gradients still flow
    torch.manual_seed(cfg.seed)
    params = [p for p in drafter.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, betas=(0.9, 0.99), weight_decay=0.0)
    qparams = grid.params_by_name(drafter, list(cfg.qat_params))
    pad = pair.tokenizer.pad_token_id or 0
    history: list[dict[str, Any]] = []
    start = 0
    state = ckpt.load()
    if state is not None:
        drafter.load_state_dict(state["drafter"])
        opt.load_state_dict(state["optimizer"])
        start, history = int(state["step"]), list(state["history"])
    t0 = time.monotonic()
    step = start
    try:
        while step < cfg.steps:
            batch = teacher.batch(batch_indices(cfg.seed, step, len(teacher), cfg.batch_size))
            for group in opt.param_groups:
                group["lr"] = lr_at(step, cfg.steps, cfg.lr)
            with grid.fake_quant(qparams):
                loss = _loss(drafter, pair, batch, cfg.k, pad)
                opt.zero_grad(set_to_none=True)
                loss.backward()
            torch.nn.utils.clip_grad_norm_(params, cfg.clip)
            opt.step()
            step += 1
            loss_value = loss.item()
            summary = None
            if step % cfg.eval_every == 0 or step == cfg.steps:
                with grid.fake_quant(qparams):
                    summary = evaluate(pair, drafter, heldout, cfg.k).summary()
                history.append({"step": step, "loss": round(loss_value, 6), "heldout": summary})
            on_step(StepReport(step, cfg.steps, loss_value, summary, start))
            if step % cfg.checkpoint_every == 0 and step < cfg.steps:
                ckpt.save(step, drafter, opt, history)
    except KeyboardInterrupt:
        if step > start:
            ckpt.save(step, drafter, opt, history)  # Ctrl-C: the next run continues from here
        raise
    grid.project_(qparams)
    return TrainResult(cfg.steps, start, time.monotonic() - t0, history)


__all__ = ["StepReport", "TrainConfig", "TrainResult", "batch_indices", "cluster_index", "evaluate", "lr_at",
           "train"]
