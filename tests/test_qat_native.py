"""The compiled exact-Q4_0 search writes the bytes the numpy search and packer write, edge cases included."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from edgekit.convert import qat, qat_native

BLOCK = 32


@pytest.fixture(scope="module")
def lib():  # type: ignore[no-untyped-def]
    kernel = qat_native.kernel()
    # Every machine that builds llama.cpp has a C compiler; .ci/install puts one on CI's.
    assert kernel is not None or not shutil.which("cc"), "cc is here but the kernel did not build"
    if kernel is None:
        pytest.skip("no C compiler: the numpy search is what runs here")
    return kernel


def _blocks(rng: np.random.Generator) -> np.ndarray:
    """(n, 32) float32: on-grid blocks of every step kind and sign, and blocks that must not match."""
    n = 4096
    q = rng.integers(-8, 8, size=(n, BLOCK)).astype(np.float32)
    # steps from fp16 subnormals (2^-24) to near fp16's top, with mantissas fp16 holds
    d = np.ldexp(1 + rng.integers(0, 1024, size=(n, 1)) / 1024, rng.integers(-24, 14, size=(n, 1))).astype(np.float32)
    on = q * d
    top_seven = np.clip(q, -7, 7) * d  # largest magnitude on ±7 (a later m than 8)
    small_levels = np.clip(q, -3, 3) * d  # m = 3, 2 or 1
    positive_top = -on  # +8·d: only the negative step holds
    off = rng.normal(0, 1, size=(n, BLOCK)).astype(np.float32)  # ordinary weights: no step holds
    halves = (q + 0.5) * d  # every value sits on a rounding tie for the true step
    one_off = on.copy()
    one_off[:, 5] = np.nextafter(one_off[:, 5], np.float32(np.inf))  # one value one ulp off the grid
    special = np.zeros((8, BLOCK), dtype=np.float32)
    special[1] = -0.0
    special[2, ::2] = -0.0
    special[3, 3] = np.inf
    special[4, 7] = np.nan
    special[5] = np.float32(65504.0)  # fp16's largest: the step 65504/8 exists
    special[6, 0] = np.float32(1e38)  # the step overflows fp16
    special[7, 0] = np.float32(2.0**-30)  # below fp16's smallest step: d rounds to 0 for every m
    return np.concatenate([on, top_seven, small_levels, positive_top, off, halves, one_off, special])


def test_kernel_writes_the_numpy_search_and_packing_bytes(lib) -> None:  # type: ignore[no-untyped-def]
    w = _blocks(np.random.default_rng(7))
    out = np.empty((w.shape[0], qat.Q4_0_BYTES), dtype=np.uint8)
    ok = qat_native.search_pack(w, out, lib)
    d, q, ok_numpy = qat._search(w)
    assert np.array_equal(ok, ok_numpy)
    assert 0.3 < ok.mean() < 0.9  # both kinds are in the mix
    assert np.array_equal(out[ok], qat.pack_q4_0(d, q)[ok])


def test_exact_q4_0_gives_the_same_result_with_and_without_the_kernel(lib, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(3)
    q = rng.integers(-8, 8, size=(64, 4096)).astype(np.float32)
    d = np.ldexp(1 + rng.integers(0, 8, size=(64, 128, 1)) / 8, rng.integers(-12, -5, size=(64, 128, 1)))
    bf16 = ((q.reshape(64, 128, 32) * d.astype(np.float32)).reshape(64, 4096).view(np.uint32) >> 16).astype(np.uint16)
    bent = bf16.copy()
    bent[10, 100] ^= 1  # one value off the grid: the tensor falls back whole, either way
    for values in (bf16, bent):
        native = qat.exact_q4_0(values, threads=2)
        monkeypatch.setattr(qat_native, "_LOADED", [None])  # as on a machine without a compiler
        assert qat_native.kernel() is None
        plain = qat.exact_q4_0(values, threads=2)
        monkeypatch.undo()
        assert qat_native.kernel() is lib
        assert (native.blocks, native.exact_blocks) == (plain.blocks, plain.exact_blocks)
        assert (native.packed is None) == (plain.packed is None) == (values is bent)
        if native.packed is not None:
            assert np.array_equal(native.packed, plain.packed)


def test_search_pack_refuses_a_wrong_output_array(lib) -> None:  # type: ignore[no-untyped-def]
    w = np.zeros((4, BLOCK), dtype=np.float32)
    with pytest.raises(ValueError, match="C-contiguous"):
        qat_native.search_pack(w, np.empty((4, 17), dtype=np.uint8), lib)


@pytest.mark.parametrize("native", [True, False], ids=["kernel", "numpy"])
def test_the_proof_catches_a_wrong_block_anywhere_in_a_chunk(native: bool, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # 8192 blocks: one chunk, proven in several groups; a packer that gets the last block wrong must not pass.
    rng = np.random.default_rng(5)
    w = rng.integers(-8, 8, size=(64, 4096)).astype(np.float32) * np.float32(2.0**-7)
    assert w.size // BLOCK > 2 * qat._PROOF_BLOCKS
    assert qat.exact_q4_0(w).exact
    if native:
        if qat_native.kernel() is None:
            pytest.skip("no C compiler")
        real = qat_native.search_pack

        def bent_kernel(chunk, out, lib):  # type: ignore[no-untyped-def]
            ok = real(chunk, out, lib)
            out[-1, -1] ^= 0x10  # one level of the block's last value
            return ok

        monkeypatch.setattr(qat_native, "search_pack", bent_kernel)
    else:
        monkeypatch.setattr(qat_native, "_LOADED", [None])
        real_pack = qat.pack_q4_0

        def bent_pack(d, q):  # type: ignore[no-untyped-def]
            out = real_pack(d, q)
            out[-1, -1] ^= 0x10
            return out

        monkeypatch.setattr(qat, "pack_q4_0", bent_pack)
    with pytest.raises(AssertionError, match="do not dequantize"):
        qat.exact_q4_0(w, threads=2)
