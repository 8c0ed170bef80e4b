"""QAT-like weights: 2-D weights (and a mixture of experts' fused 3-D ones) snapped to the 4-bit grid an exact
Q4_0 repack stores without loss."""

from __future__ import annotations

from collections.abc import Callable

QAT_BLOCK = 32


def snap_to_grid(weight, seed: int, block: int = QAT_BLOCK):  # torch.Tensor -> torch.Tensor (bf16)
    """Put a weight on a QAT-like 4-bit grid: per block of ``block`` values along its last dimension, w = q·d,
    q ∈ [-8, 7].

    d is a power of two times 1, 1.125, …, 1.875 (4 significant bits), so q·d has at most 8
    significant bits and is exact in bf16, and d itself is exact in fp16: what Google's QAT
    checkpoints look like, and what an exact Q4_0 repack can store without loss.
    """
    import torch

    shape = weight.shape
    assert shape[-1] % block == 0, "last dimension must be a multiple of the block size"
    g = torch.Generator().manual_seed(seed)
    w = weight.detach().float().reshape(-1, block)
    amax = w.abs().amax(dim=1, keepdim=True).clamp_min(1e-8)
    exp = torch.floor(torch.log2(amax / 8))
    frac = torch.randint(0, 8, amax.shape, generator=g).float()
    d = torch.ldexp(1 + frac / 8, exp.int())
    q = torch.clamp(torch.round(w / d), -8, 7)
    return (q * d).reshape(shape).to(torch.bfloat16)


def qat_copy(model, seed: int, keep: Callable[[str], bool] = lambda _name: True) -> None:
    """Snap every 2-D weight, and every fused 3-D expert weight (the 26B-A4B's), whose name ``keep`` accepts (QAT
    covers the text model, not the towers)."""
    import torch

    with torch.no_grad():
        for i, (name, p) in enumerate(sorted(model.named_parameters())):
            if p.dim() in (2, 3) and p.shape[-1] % QAT_BLOCK == 0 and keep(name):
                p.copy_(snap_to_grid(p, seed * 1000 + i).to(p.dtype))


__all__ = ["QAT_BLOCK", "qat_copy", "snap_to_grid"]
