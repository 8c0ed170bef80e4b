"""One model → one GGUF of the recipe's type, checked, into the store (skipped when unchanged).

Types and how they are made:

- ``F32``/``F16``/``BF16``/``Q8_0``: the pinned converter's ``--outtype``;
- ``Q4_0``/``Q4_K_M``/``Q5_K_M``/``Q6_K``: converter to a lossless file, then ``llama-quantize``;
- ``q4_0-exact``: the converter's metadata skeleton while the weights are packed straight from the
  safetensors (:mod:`edgekit.convert.checkpoint_repack`); else a lossless file as the template, then
  :func:`repack_gguf`.
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgekit import __version__
from edgekit.convert.checkpoint_repack import repack_checkpoint
from edgekit.convert.gguf_io import GGUFFile, GGUFInfo, check_gguf
from edgekit.convert.inputs import ModelInput
from edgekit.convert.llamacpp import CONVERTER_OUTTYPES, LlamaCpp
from edgekit.convert.repack import GGUFValues, repack_gguf, write_report
from edgekit.errors import EdgekitError
from edgekit.models.safetensors import open_model
from edgekit.models.validate import ModelInfo
from edgekit.store import Artifact, Store

KIND = "gguf"
QUANTIZE_TYPES = ("Q4_0", "Q4_K_M", "Q5_K_M", "Q6_K")
# Tensors the Gemma 4 converters generate rather than map (rope frequencies of the full layers).
GENERATED = {"gemma4": {"rope_freqs.weight"}, "gemma4-assistant": {"rope_freqs.weight"}}
RECIPE_VERSION = 1  # bump when this module would write different files for the same inputs


@dataclass
class Converted:
    role: str
    artifact: Artifact
    cached: bool
    seconds: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def file(self) -> Path:
        return self.artifact.file(self.artifact.manifest["gguf_file"])

    def to_dict(self) -> dict[str, Any]:
        m = self.artifact.manifest
        entry = next((f for f in m.get("files", []) if f["name"] == m["gguf_file"]), {})
        return {"role": self.role, "file": str(self.file), "key": self.artifact.key, "cached": self.cached,
                "seconds": round(self.seconds, 2), "quant": m["quant"], "arch": m["gguf"]["arch"],
                "tensors": m["gguf"]["tensors"], "size": entry.get("size"), "sha256": entry.get("sha256"),
                "source": m["source"], "repack": m.get("repack"), "head": m.get("head")}


def lossless_outtype(info: ModelInfo) -> str:
    """bf16 keeps bf16 checkpoints bit for bit; anything wider needs f32."""
    return "bf16" if set(info.dtypes) <= {"BF16"} else "f32"


def store_key(model: ModelInput, quant: str, fallback: str, llama: LlamaCpp) -> str:
    return Store.key({"stage": "convert-gguf", "version": RECIPE_VERSION, "role": model.role,
                      "source": model.identity, "quant": quant, "fallback": fallback if quant == "q4_0-exact"
                      else None, "converter": llama.identity})


def expected_tensors(llama: LlamaCpp, info: ModelInfo) -> tuple[str, set[str]]:
    """(GGUF arch, tensor names) the converter must write for this checkpoint."""
    config = json.loads((info.path / "config.json").read_text())
    arch, mapping = llama.gguf_names(config, sorted(open_model(info.path)))
    return arch, {g for g in mapping.values() if g} | GENERATED.get(arch, set())


def head_facts(llama: LlamaCpp, info: ModelInfo) -> dict[str, Any] | None:
    """For an assistant with ordered embeddings: which head the GGUF keeps, and what the converter drops.

    With edgekit's llama.cpp patch 0002 the converter keeps ``masked_embedding.*`` and llama-server drafts
    with the ordered head, as LiteRT-LM (edgekit's bundle) and vLLM do. A converter without it (the pinned
    one as published) drops them: llama-server then drafts with the full tied head, which scores every token,
    not the top-k centroids' share, and whose argmax can differ from the published head's.
    """
    if not info.ordered_head:
        return None
    config = json.loads((info.path / "config.json").read_text())
    _, mapping = llama.gguf_names(config, sorted(open_model(info.path)))
    dropped = sorted(n for n, g in mapping.items() if g is None and n.startswith("masked_embedding."))
    kept = not dropped
    return {"checkpoint": "ordered", **info.ordered_head, "tokens_scored": info.head_tokens,
            "gguf": "ordered" if kept else "dense", "gguf_tokens_scored": info.head_tokens if kept else info.vocab_size,
            "dropped": dropped,
            "note": None if kept else (
                f"llama.cpp's converter drops {', '.join(dropped)}: llama-server drafts with the full tied head "
                f"(all {info.vocab_size} tokens), not the checkpoint's centroid-masked head (top "
                f"{info.ordered_head['top_k']} of {info.ordered_head['num_centroids']} centroids, "
                f"{info.head_tokens} tokens); LiteRT-LM and vLLM run the ordered head.")}


def convert_model(model: ModelInput, info: ModelInfo, quant: str, fallback: str, llama: LlamaCpp,
                  store: Store, force: bool = False, fast: bool = True) -> Converted:
    """``fast`` (q4_0-exact): metadata from the converter, weights straight from the checkpoint; False
    takes the converter's whole lossless file as the template (the same bytes, slower)."""
    t0 = time.perf_counter()
    key = store_key(model, quant, fallback, llama)
    if not force and (art := store.get(KIND, key)) is not None:
        return Converted(model.role, art, cached=True)
    arch, names = expected_tensors(llama, info)
    if arch != info.gguf_arch:
        raise EdgekitError(f"The pinned converter maps {info.architecture} to {arch!r}, not {info.gguf_arch!r}.")
    staging = store.staging_dir()
    work = staging / "work"  # intermediates, removed before the artifact is stored
    work.mkdir()
    try:
        out_name = f"{model.role}-{quant.lower()}.gguf"
        out = staging / out_name
        log = work / "convert.log"
        manifest: dict[str, Any] = {}
        if quant in CONVERTER_OUTTYPES:
            llama.convert(info.path, out, CONVERTER_OUTTYPES[quant], log)
        elif quant in QUANTIZE_TYPES:
            lossless = work / "lossless.gguf"
            llama.convert(info.path, lossless, lossless_outtype(info), log)
            llama.quantize(lossless, out, quant, log)
        elif quant == "q4_0-exact":
            report = repack_checkpoint(llama, info.path, arch, lossless_outtype(info), out, fallback, work, log) \
                if fast else None
            if report is None:  # the converter's whole lossless file as the template
                template = work / "template.gguf"
                llama.convert(info.path, template, lossless_outtype(info), log)
                check_gguf(template, arch, names)
                tfile = GGUFFile(template)
                report = repack_gguf(tfile, GGUFValues(tfile), out, fallback)
            write_report(report, staging / f"{model.role}-repack.json")
            manifest["repack"] = report.summary()
        else:
            raise EdgekitError(f"Quant type {quant!r} is not one edgekit can convert to.")
        checked: GGUFInfo = check_gguf(out, arch, names)
        shutil.copy(log, staging / f"{model.role}-convert.log")
        shutil.rmtree(work)
        manifest.update({
            "stage": "convert", "role": model.role, "gguf_file": out_name, "quant": quant,
            "fallback": fallback if quant == "q4_0-exact" else None, "source": model.identity,
            "architecture": info.architecture, "gguf": checked.to_dict(),
            "converter": {"identity": llama.identity, "commit": llama.commit},
            "tools": {"edgekit": __version__, "gguf": _gguf_version()},
        })
        if (head := head_facts(llama, info)) is not None:
            manifest["head"] = head
        art = store.put(KIND, key, staging, manifest)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return Converted(model.role, art, cached=False, seconds=time.perf_counter() - t0)


MMPROJ_OUTTYPE = "f16"  # what llama.cpp's own mmproj files use: half the f32 size, the towers' precision


def convert_mmproj(model: ModelInput, info: ModelInfo, llama: LlamaCpp, store: Store,
                   force: bool = False) -> Converted:
    """The target's vision/audio towers and projectors as llama.cpp's mmproj GGUF (``--mmproj``)."""
    t0 = time.perf_counter()
    key = Store.key({"stage": "convert-mmproj", "version": RECIPE_VERSION, "source": model.identity,
                     "outtype": MMPROJ_OUTTYPE, "converter": llama.identity})
    if not force and (art := store.get(KIND, key)) is not None:
        return Converted("mmproj", art, cached=True)
    staging = store.staging_dir()
    try:
        out_name = "mmproj.gguf"
        log = staging / "mmproj-convert.log"
        llama.convert(info.path, staging / out_name, MMPROJ_OUTTYPE, log, mmproj=True)
        header = GGUFFile(staging / out_name)
        projectors = [str(header.get(k)) for k in ("clip.vision.projector_type", "clip.audio.projector_type",
                                                   "clip.projector_type") if k in header.kv_raw]
        if not projectors:
            raise EdgekitError(f"The converter's mmproj of {model.label} names no projector; see {log}.")
        arch = str(header.arch or "")
        manifest = {"stage": "convert-mmproj", "role": "mmproj", "gguf_file": out_name,
                    "quant": MMPROJ_OUTTYPE.upper(), "source": model.identity, "architecture": info.architecture,
                    "towers": list(info.towers),
                    "gguf": {"arch": arch, "tensors": len(header.tensors), "projectors": projectors},
                    "converter": {"identity": llama.identity, "commit": llama.commit},
                    "tools": {"edgekit": __version__, "gguf": _gguf_version()}}
        art = store.put(KIND, key, staging, manifest)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return Converted("mmproj", art, cached=False, seconds=time.perf_counter() - t0)


def _gguf_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("gguf")
    except PackageNotFoundError:
        return "unknown"
