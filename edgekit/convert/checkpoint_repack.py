"""Exact Q4_0 of a checkpoint dir, end to end, without converting its weights to bf16 first.

Two things run at once: the pinned converter writes the metadata skeleton in a subprocess (it imports
torch and reads the tokenizer: seconds, on one core), while this process packs the 2-D weights straight
from the memory-mapped safetensors (both cores). A skeleton made before for the same small files, weight
shapes and held tensors is taken from the cache instead. The skeleton then says which tensors the
converter would quantize, in which order; the packed weights it agrees with go into the output as they are.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from edgekit.convert.llamacpp import LlamaCpp
from edgekit.convert.repack import RepackReport, SafetensorsValues, pack_ahead, repack_gguf
from edgekit.convert.skeleton import (
    PLAIN_2D_ARCHS,
    NotInSkeleton,
    SkeletonJob,
    cached_skeleton,
    remember_skeleton,
    skeleton_cached,
    skeleton_key,
    vocab_path,
)
from edgekit.models.safetensors import open_model


def repack_checkpoint(llama: LlamaCpp, model_dir: Path, gguf_arch: str, outtype: str, out: Path, fallback: str,
                      work: Path, log: Path) -> RepackReport | None:
    """The repack of ``model_dir`` into ``out``; None when this path does not apply (then convert to bf16 first).

    It does not apply to architectures whose converter transforms 2-D weights beyond a name map, or when
    the repack needs converter bytes the skeleton left out (a weight with no safetensors source).
    """
    if gguf_arch not in PLAIN_2D_ARCHS:
        return None
    t0 = time.perf_counter()
    key = skeleton_key(llama, model_dir, outtype)

    def start() -> SkeletonJob:
        return SkeletonJob(llama, model_dir, outtype, work / "skeleton.gguf", log, vocab=vocab_path(llama, model_dir))

    # The worker is the longer of the two: it starts first, unless a skeleton for the key is there.
    job = None if skeleton_cached(key) else start()
    skeleton = None
    ahead_file = work / "packed-ahead.bin"
    try:
        config = json.loads((model_dir / "config.json").read_text())
        files = open_model(model_dir)
        _arch, names = llama.gguf_names(config, sorted(files), light=True)
        values = SafetensorsValues(model_dir, names)
        sources = {g: (lambda st=st, h=h: st.raw(h).tobytes()) for g, (st, h) in values.by_gguf.items()}
        if job is None:
            skeleton = cached_skeleton(key, sources)
            if skeleton is None:  # stale: a tensor it holds changed
                job = start()
            else:
                log.write_text(f"converter metadata: skeleton {key} from the cache (same small files and held "
                               "tensors)\n")

        def threads() -> int | None:  # while the worker runs it keeps a core; the packing takes the rest
            return max(1, (os.cpu_count() or 1) - 1) if job is not None and job.proc.poll() is None else None

        with open(ahead_file, "wb") as fh:
            ahead = pack_ahead(values, fallback, fh, threads=threads)
        if job is not None:
            skeleton = job.result()
            remember_skeleton(key, skeleton, job.listing, sources)
    except BaseException:
        ahead_file.unlink(missing_ok=True)
        if job is not None:
            job.cancel()
        raise
    assert skeleton is not None
    try:
        report = repack_gguf(skeleton, values, out, fallback, ahead=ahead, ahead_file=ahead_file)
    except NotInSkeleton:
        return None
    finally:
        ahead_file.unlink(missing_ok=True)
        if job is not None:
            job.finish()  # it writes the vocabulary cache while the output is written
    report.template = "the pinned converter's metadata and small tensors (its weights not converted)"
    report.seconds = time.perf_counter() - t0
    return report
