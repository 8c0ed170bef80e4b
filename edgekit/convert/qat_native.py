"""The exact-Q4_0 step search and packing in C: the bytes of :func:`edgekit.convert.qat._search` and
:func:`edgekit.convert.qat.pack_q4_0`, ≈ 9× faster with this CPU's vector width.

numpy spends ≈ 21 ms of one core per 4 Mi values on the search (16 candidate steps, each a pass over
whole arrays; two thirds of a repack's packing) and 3.4 ms on the packing. This kernel tries the same
candidates in the same order, one block at a time, in the same float32 and fp16 arithmetic, stops at the
first step that holds (most blocks: the first) and writes the block: 2.5 ms for both on AVX-512. It is
compiled once per source, compiler and CPU with the workstation's C compiler (the one llama.cpp's build
uses) into ``~/.cache/edgekit/kernels/`` and loaded with ctypes, which lets go of the GIL during the call,
so chunks still run on every core. Without a compiler, or with one that lacks ``_Float16``, or with
``EDGEKIT_NATIVE=0``, the numpy search stays in use. Every packed chunk is still proven by ``gguf.quants``.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import threading
from pathlib import Path

import numpy as np

from edgekit.paths import build_dir_once, cache_dir

# float32 and IEEE binary16 (`_Float16`, round to nearest even) exactly as numpy computes them:
# -ffp-contract=off keeps every product a product (no fused multiply-add), and no -ffast-math.
SOURCE = r"""
#include <stdint.h>
#include <string.h>
#include <math.h>

/* For each (n, 32) block of w: the first step d = fp16(float(sign / m) * amax), m = 8..1, sign +1 then -1,
   with every value == clip(rint(w * (1 / d)), -8, 7) * d; out gets the block as ggml's block_q4_0 (fp16 d
   little-endian, then byte j = (q[j] + 8) | (q[j + 16] + 8) << 4), ok 1. All-zero blocks: d = 0, levels 0,
   ok. Non-finite or unmatched blocks: zeros, ok 0. Returns the ok count. */
int64_t edgekit_q4_search(const float *w, int64_t n, uint8_t *out, uint8_t *ok_out) {
    int64_t hits = 0;
    for (int64_t b = 0; b < n; b++) {
        const float *x = w + 32 * b;
        uint8_t *blk = out + 18 * b;
        uint32_t top = 0;
        for (int i = 0; i < 32; i++) {
            uint32_t u;
            memcpy(&u, x + i, 4);
            u &= 0x7FFFFFFFu;
            if (u > top) top = u;
        }
        memset(blk, 0, 2);
        memset(blk + 2, 0x88, 16);  /* level 0 */
        ok_out[b] = 0;
        if (top == 0) { ok_out[b] = 1; hits++; continue; }
        memset(blk + 2, 0, 16);
        if (top >= 0x7F800000u) continue;  /* inf or NaN: never exact */
        float amax;
        memcpy(&amax, &top, 4);
        int found = 0;
        for (int m = 8; m >= 1 && !found; m--) {
            for (int s = 0; s < 2 && !found; s++) {
                float step = (float)((s ? -1.0 : 1.0) / (double)m);
                _Float16 h = (_Float16)(step * amax);
                float d = (float)h;
                if (!isfinite(d) || d == 0.0f) continue;
                float inv = 1.0f / d;
                float lv[32];
                int bad = 0;
                /* clip, then round half to even: the same as rint, then clip, for integer bounds; adding and
                   taking away 1.5 * 2^23 rounds any |v| <= 8 to nearest even without a libm call. No early
                   exit, so the compiler can vectorise the 32 lanes. */
                for (int i = 0; i < 32; i++) {
                    float v = x[i] * inv;
                    v = v < -8.0f ? -8.0f : v;
                    v = v > 7.0f ? 7.0f : v;
                    v = (v + 12582912.0f) - 12582912.0f;
                    bad |= (v * d != x[i]);
                    lv[i] = v;
                }
                if (!bad) {
                    uint16_t bits;
                    memcpy(&bits, &h, 2);
                    blk[0] = (uint8_t)(bits & 0xFF);
                    blk[1] = (uint8_t)(bits >> 8);
                    for (int j = 0; j < 16; j++)
                        blk[2 + j] = (uint8_t)((int)lv[j] + 8) | (uint8_t)(((int)lv[j + 16] + 8) << 4);
                    ok_out[b] = 1;
                    hits++;
                    found = 1;
                }
            }
        }
    }
    return hits;
}
"""

_LOCK = threading.Lock()
_LOADED: list[ctypes.CDLL | None] = []  # [] not tried yet; [None] no kernel on this machine


def _compiler() -> str | None:
    return shutil.which(os.environ.get("CC") or "cc") or shutil.which("gcc")


def _cpu() -> str:
    """This CPU's model and feature flags: a kernel built for it (-march=native) is kept per CPU."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.machine()
    return platform.machine() + "".join(sorted({ln for ln in lines if ln.startswith(("model name", "flags",
                                                                                     "Features"))}))


def _build(cc: str) -> Path | None:
    version = subprocess.run([cc, "--version"], capture_output=True, text=True, check=False).stdout
    key = hashlib.sha256(f"{cc}\0{version}\0{_cpu()}\0{SOURCE}".encode()).hexdigest()[:16]

    def make(tmp: Path) -> None:
        (tmp / "q4search.c").write_text(SOURCE)
        # -march=native: this CPU's vector width (AVX-512 searches 32 lanes in two steps: ≈ 9× numpy here,
        # 2× without it); a compiler that cannot target the host gets the portable build.
        for arch in (["-march=native"], []):
            done = subprocess.run([cc, "-O3", *arch, "-fPIC", "-shared", "-ffp-contract=off", "-fno-fast-math",
                                   "-o", str(tmp / "q4search.so"), str(tmp / "q4search.c"), "-lm"],
                                  capture_output=True, check=False, timeout=120)
            if done.returncode == 0:
                return
        raise OSError(done.stderr.decode(errors="replace")[-300:])

    try:
        return build_dir_once(cache_dir() / "kernels" / f"q4search-{key}", "q4search.so", make) / "q4search.so"
    except (OSError, subprocess.SubprocessError):
        return None


def kernel() -> ctypes.CDLL | None:
    """The compiled search, or None (no compiler, a compile error, or EDGEKIT_NATIVE=0)."""
    with _LOCK:
        if not _LOADED:
            lib = None
            cc = _compiler() if os.environ.get("EDGEKIT_NATIVE", "1") != "0" else None
            path = _build(cc) if cc else None
            if path is not None:
                try:
                    lib = ctypes.CDLL(str(path))
                    fn = lib.edgekit_q4_search
                    fn.restype = ctypes.c_int64
                    fn.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p]
                except OSError:
                    lib = None
            _LOADED.append(lib)
        return _LOADED[0]


def search_pack(blocks: np.ndarray, out: np.ndarray, lib: ctypes.CDLL) -> np.ndarray:
    """Search a C-contiguous (n, 32) float32 array and write its blocks as Q4_0 into ``out`` ((n, 18) uint8,
    C-contiguous); returns the exact flags. For the exact blocks, ``out`` holds
    ``qat.pack_q4_0(*qat._search(blocks)[:2])``; the other blocks' bytes are meaningless."""
    blocks = np.ascontiguousarray(blocks, dtype=np.float32)
    n = blocks.shape[0]
    if out.shape != (n, 18) or out.dtype != np.uint8 or not out.flags.c_contiguous:
        raise ValueError(f"search_pack needs a C-contiguous ({n}, 18) uint8 array, not {out.dtype} {out.shape}")
    ok = np.empty(n, dtype=np.bool_)
    lib.edgekit_q4_search(blocks.ctypes.data, n, out.ctypes.data, ok.ctypes.data)
    return ok
