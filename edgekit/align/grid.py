"""Keeping a QAT drafter on its 4-bit grid, so the exact Q4_0 repack still stores it without loss.

Google's QAT drafters (and edgekit's tiny QAT ones) hold every matrix as q·d per block of 32 values,
q ∈ [-8, 7]. Plain fine-tuning would move the weights off that grid and the repack would fall back
to Q8_0. With QAT on, training runs with the straight-through estimator: each forward/backward sees
the weights projected onto the grid, the optimizer updates full-precision master weights, and the
final weights are the projection. Steps d are rounded to 4 significant bits, so q·d is exact in bf16
and d in fp16: :func:`edgekit.convert.qat.exact_q4_0` then finds every block.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

BLOCK = 32
_MANTISSA_STEPS = 8  # d = 2^e · (1 + f/8): 4 significant bits


def eligible(p: Any) -> bool:
    return p.dim() == 2 and p.shape[-1] % BLOCK == 0


def on_grid(model: Any) -> list[str]:
    """Names of the matrices that are exact Q4_0 already (checked with the repack's own search)."""
    from edgekit.convert.qat import exact_q4_0

    names = []
    for name, p in model.named_parameters():
        if eligible(p) and exact_q4_0(p.detach().float().cpu().numpy(), prove=False, threads=1).exact:
            names.append(name)
    return names


def _round_steps(d0: Any) -> list[Any]:
    """The two 4-significant-bit steps around each d0 (d0 > 0)."""
    import torch

    e = torch.floor(torch.log2(d0))
    frac = d0 / torch.exp2(e) - 1  # in [0, 1)
    down = torch.floor(frac * _MANTISSA_STEPS)
    return [torch.exp2(e) * (1 + down / _MANTISSA_STEPS), torch.exp2(e) * (1 + (down + 1) / _MANTISSA_STEPS)]


def project(w: Any) -> Any:
    """The nearest (per block, least squares over a few candidate steps) q·d with q ∈ [-8, 7]."""
    import torch

    blocks = w.detach().float().reshape(-1, BLOCK)
    amax = blocks.abs().amax(dim=1, keepdim=True)
    safe = amax.clamp_min(torch.finfo(torch.float32).tiny)
    best, best_err = torch.zeros_like(blocks), torch.full_like(amax, float("inf"))
    for m in (8.0, 7.5, 7.0):
        for d in _round_steps(safe / m):
            q = torch.clamp(torch.round(blocks / d), -8, 7)
            cand = q * d
            err = ((blocks - cand) ** 2).sum(dim=1, keepdim=True)
            better = err < best_err
            best = torch.where(better, cand, best)
            best_err = torch.where(better, err, best_err)
    best = torch.where(amax > 0, best, torch.zeros_like(best))
    return best.reshape(w.shape).to(w.dtype)


def params_by_name(model: Any, names: list[str]) -> list[Any]:
    table = dict(model.named_parameters())
    return [table[n] for n in names]


@contextmanager
def fake_quant(params: list[Any]) -> Iterator[None]:
    """Inside: the weights are their projection (forward and backward see the grid). After: the master
    weights are back, holding the gradient computed on the grid (straight-through estimator)."""
    import torch

    masters = [p.detach().clone() for p in params]
    with torch.no_grad():
        for p in params:
            p.copy_(project(p))
    try:
        yield
    finally:
        with torch.no_grad():
            for p, m in zip(params, masters, strict=True):
                p.copy_(m)


def project_(params: list[Any]) -> None:
    import torch

    with torch.no_grad():
        for p in params:
            p.copy_(project(p))


__all__ = ["eligible", "fake_quant", "on_grid", "params_by_name", "project", "project_"]
