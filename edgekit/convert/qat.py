"""Exact Q4_0 for weights that already sit on a 4-bit grid (Gemma 4 QAT checkpoints).

Q4_0 stores each block of 32 values as one fp16 step ``d`` and 32 4-bit levels: value = (n − 8)·d.
A QAT weight block is ``q·d`` with q ∈ [-8, 7] for some step the training chose, so it can be
stored without loss if that step is found. For each block the search tries d = ±amax/m, m = 8…1
(the largest magnitude sits on level −8 or on ±m), rounds d to fp16 and keeps it only if *every*
value equals q·d exactly. The search and packing run in C where the workstation can compile
``qat_native``'s kernel (the same bytes); otherwise in numpy over whole chunks of blocks (gguf-py style),
where the only Python loops are over the 16 candidate steps and over memory-sized chunks.
"""

from __future__ import annotations

import ctypes
import functools
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
from gguf import quants

from edgekit.convert import qat_native

BLOCK = 32
Q4_0_BYTES = 2 + BLOCK // 2  # fp16 d + 16 bytes of nibbles
# 512 Ki values (2 MB of f32) per step: widened, searched and proven while they sit in the CPU's cache. On a
# 1.11 GB drafter 15–16 ms of one core per 4 Mi values against 27 ms with 4 Mi-value steps and one proof each.
_CHUNK_BLOCKS = 1 << 14
_PROOF_BLOCKS = 2048  # gguf.quants' Q4_0 dequantization makes several temporaries: keep them cache-sized


@dataclass(frozen=True)
class ExactQ4:
    """Result for one tensor: packed Q4_0 rows (when every block is exact) and the block counts."""

    blocks: int
    exact_blocks: int
    packed: np.ndarray | None  # uint8, shape (..., cols // 32 * 18); None unless all blocks exact

    @property
    def exact(self) -> bool:
        return self.blocks == self.exact_blocks


def eligible_shape(shape: tuple[int, ...]) -> bool:
    """Q4_0 needs a matrix (or stack of them) whose rows split into whole blocks of 32."""
    return len(shape) >= 2 and shape[-1] % BLOCK == 0 and shape[-1] > 0


def _search(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Steps (fp16), levels (int8 in [-8, 7]) and an exact flag per block of a (n, 32) f32 array."""
    n = blocks.shape[0]
    d_out = np.zeros(n, dtype=np.float16)
    q_out = np.zeros((n, BLOCK), dtype=np.int8)
    # max |w| per block on the bit patterns: for non-NaN floats the order is the integer order, and
    # a reduction over 32 uint32 is several times faster in numpy than np.abs(...).max(axis=1).
    amax = (blocks.view(np.uint32) & np.uint32(0x7FFFFFFF)).max(axis=1).view(np.float32)
    ok = amax == 0  # an all-zero block is exact with d = 0
    pending: np.ndarray | None = None  # None: every block (saves a gather on the first, busiest try)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        for m in range(8, 0, -1):
            for sign in (1.0, -1.0):
                sub = blocks if pending is None else blocks[pending]
                if sub.shape[0] == 0:
                    break
                a = amax if pending is None else amax[pending]
                d16 = (np.float32(sign / m) * a).astype(np.float16)
                d = d16.astype(np.float32)
                # w·(1/d) may be 1 ulp off an integer; rint absorbs that and the exact check below decides.
                q = sub * (np.float32(1.0) / d)[:, None]
                np.rint(q, out=q)
                np.clip(q, -8, 7, out=q)
                good = _rows_all(q * d[:, None] == sub) & np.isfinite(d) & (d != 0)
                if pending is None:
                    good &= ~ok
                    hit = np.flatnonzero(good)
                    rest = np.flatnonzero(~good & ~ok & np.isfinite(amax))
                else:
                    hit, rest = pending[good], pending[~good]
                d_out[hit] = d16[good]
                q_out[hit] = q[good].astype(np.int8)
                ok[hit] = True
                pending = rest
    return d_out, q_out, ok


def _rows_all(eq: np.ndarray) -> np.ndarray:
    """Row-wise all() of a contiguous (n, 32) bool array, as 4 uint64 words per row (faster)."""
    w = eq.view(np.uint64)
    return (w[:, 0] & w[:, 1] & w[:, 2] & w[:, 3]) == np.uint64(0x0101010101010101)


def pack_q4_0(d: np.ndarray, q: np.ndarray) -> np.ndarray:
    """ggml's block_q4_0 layout: fp16 d, then byte j = (q[j] + 8) | (q[j + 16] + 8) << 4."""
    n = d.shape[0]
    nib = (q.astype(np.int16) + 8).astype(np.uint8)
    out = np.empty((n, Q4_0_BYTES), dtype=np.uint8)
    out[:, :2] = d.astype("<f2").view(np.uint8).reshape(n, 2)
    out[:, 2:] = nib[:, : BLOCK // 2] | (nib[:, BLOCK // 2 :] << 4)
    return out


def widen(values: np.ndarray) -> np.ndarray:
    """float32 from float32/float16, or from bf16 given as its uint16 bit patterns (exact either way)."""
    if values.dtype == np.uint16:
        return (values.astype(np.uint32) << np.uint32(16)).view(np.float32)
    return np.asarray(values, dtype=np.float32)


def exact_q4_0(values: np.ndarray, prove: bool = True, threads: int | None = None) -> ExactQ4:
    """Try to store a tensor (numpy order, rows last) as exact Q4_0; ``values`` may be bf16 bits (uint16).

    Works chunk by chunk (widen, search, pack, prove), so memory stays near a few chunks beyond the
    output, and chunks run on ``threads`` threads (numpy and the C search, ``qat_native``, release the
    GIL; default: one per CPU, at most 4). A tensor with any inexact block falls back whole; every block is
    still searched, to count exact blocks for the report. With ``prove``, every packed chunk is
    dequantized again by ``gguf.quants`` and must equal the source: an internal error otherwise.
    """
    if not eligible_shape(values.shape):
        raise ValueError(f"shape {values.shape} cannot be stored as Q4_0")
    _keep_chunk_memory()
    cols = values.shape[-1]
    flat = values.reshape(-1, BLOCK)
    total = flat.shape[0]
    packed = np.empty((total, Q4_0_BYTES), dtype=np.uint8)

    lib = qat_native.kernel()

    def one_chunk(start: int) -> int:
        chunk = widen(flat[start : start + _CHUNK_BLOCKS])
        part = packed[start : start + chunk.shape[0]]
        if lib is not None:  # searched and packed in place (a chunk with an inexact block is not used)
            n_ok = int(qat_native.search_pack(chunk, part, lib).sum())
        else:
            d, q, ok = _search(chunk)
            n_ok = int(ok.sum())
            if n_ok == chunk.shape[0]:
                part[:] = pack_q4_0(d, q)
        if n_ok == chunk.shape[0] and prove and not _dequantizes_to(part, chunk):
            raise AssertionError("Q4_0 blocks do not dequantize to their source")
        return n_ok

    starts = range(0, total, _CHUNK_BLOCKS)
    workers = min(threads or _default_threads(), len(starts))
    if workers > 1:
        with ThreadPoolExecutor(workers) as pool:
            exact = sum(pool.map(one_chunk, starts))
    else:
        exact = sum(map(one_chunk, starts))
    if exact != total:
        return ExactQ4(total, exact, None)
    return ExactQ4(total, exact, packed.reshape(*values.shape[:-1], cols // BLOCK * Q4_0_BYTES))


@functools.cache
def _keep_chunk_memory() -> None:
    """Let glibc keep chunk-sized blocks (≤ 64 MiB) on its heaps instead of mapping and unmapping each one.

    Every chunk allocates tens of MB of temporaries (widened values, the proof's dequantization); glibc
    maps each from the kernel and hands it back when freed, so every chunk faulted its pages in again:
    on a 1.34 GB tensor 690,000 page faults, 1.0 s of system time of 3.1 s, 1.62 s wall on 2 threads;
    with these two settings 5,700 faults and 1.17 s. Process-wide and harmless elsewhere (freed memory
    up to 64 MiB stays with the process). Not glibc: nothing to do.
    """
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return
    m_trim_threshold, m_mmap_threshold = -1, -3
    mallopt(m_mmap_threshold, 64 << 20)
    mallopt(m_trim_threshold, 64 << 20)


def _default_threads() -> int:
    return max(1, min(4, os.cpu_count() or 1))


def _dequantizes_to(packed: np.ndarray, values: np.ndarray) -> bool:
    """Whether gguf.quants' Q4_0 dequantization of (n, 18) blocks equals (n, 32) float32 ``values``.

    Its block function is called on groups of blocks directly: ``quants.dequantize`` would cut the
    same blocks into groups of 16 rows and join the results in a new array (twice the time of the
    check itself on 4 Mi values).
    """
    return packed.shape[0] == values.shape[0] and all(
        values_equal(quants.Q4_0.dequantize_blocks(packed[s : s + _PROOF_BLOCKS]), values[s : s + _PROOF_BLOCKS])
        for s in range(0, packed.shape[0], _PROOF_BLOCKS))


def values_equal(a: np.ndarray, b: np.ndarray) -> bool:
    """Every element equal as a number (−0.0 == +0.0; any NaN makes it False).

    For finite floats this is bit-for-bit equality up to the sign of zero, which no arithmetic
    on the weights can tell apart; a dequantized Q4_0 block is always finite.
    """
    return a.shape == b.shape and bool(np.array_equal(a, b))
