"""``edgekit repack``: a GGUF whose on-grid weights are stored as exact Q4_0.

The output takes everything but the weights from a *template* GGUF written by the pinned
converter (metadata, tokenizer, tensor names, order and the converter's type decisions), so
llama.cpp loads it exactly like the converter's own file. Weight values come from the source:
the bf16 safetensors (mapped to GGUF names by the converter's own tensor map) or a lossless
GGUF. Each weight the converter would quantize is tried as exact Q4_0; a tensor with any block
off the grid falls back whole to Q8_0 or F16. Every Q4_0 tensor written is dequantized again with
``gguf.quants`` and compared with its source bit for bit: that comparison is the report's proof.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType, LlamaFileType, quants

from edgekit.convert.gguf_io import GGUFFile, TensorInfo, write_gguf
from edgekit.convert.qat import BLOCK, eligible_shape, exact_q4_0, widen
from edgekit.errors import EdgekitError

Q4_0 = GGMLQuantizationType.Q4_0
Q8_0 = GGMLQuantizationType.Q8_0
F16 = GGMLQuantizationType.F16
F32 = GGMLQuantizationType.F32
BF16 = GGMLQuantizationType.BF16
FALLBACKS = {"Q8_0": Q8_0, "F16": F16}
_Q8_BLOCK_BYTES = 34  # fp16 d + 32 int8


@dataclass
class TensorResult:
    name: str
    shape: list[int]  # ggml order (ne0 first), as gguf tools print it
    type: str  # written type
    status: str  # exact | fallback | kept
    blocks: int = 0
    exact_blocks: int = 0
    bit_exact: bool | None = None  # Q4_0 dequantized by gguf.quants == source, checked while packing
    reason: str | None = None


@dataclass
class RepackReport:
    output: str
    template: str
    source: str
    fallback: str
    seconds: float = 0.0
    tensors: list[TensorResult] = field(default_factory=list)
    size: int = 0
    q8_0_size: int = 0
    q8_0_size_is_estimate: bool = True

    def summary(self) -> dict[str, Any]:
        cand = [t for t in self.tensors if t.status != "kept"]
        exact = [t for t in cand if t.status == "exact"]
        blocks = sum(t.blocks for t in cand)
        exact_blocks = sum(t.exact_blocks for t in cand)
        cand_elems = sum(int(np.prod(t.shape)) for t in cand)
        cand_bits = sum(_nbytes(t) * 8 for t in cand)
        return {
            "tensors_total": len(self.tensors),
            "tensors_quantizable": len(cand),
            "tensors_exact": len(exact),
            "tensors_fallback": len(cand) - len(exact),
            "tensors_kept": len(self.tensors) - len(cand),
            "blocks": blocks,
            "exact_blocks": exact_blocks,
            "exact_block_fraction": round(exact_blocks / blocks, 6) if blocks else None,
            "bits_per_weight": round(cand_bits / cand_elems, 4) if cand_elems else None,
            "proof_bit_exact": all(t.bit_exact for t in exact),
            "proof_tensors_checked": len(exact),
            "size": self.size,
            "q8_0_size": self.q8_0_size,
            "q8_0_size_is_estimate": self.q8_0_size_is_estimate,
            "size_vs_q8_0": round(self.size / self.q8_0_size, 4) if self.q8_0_size else None,
        }

    def to_dict(self) -> dict[str, Any]:
        return {"output": self.output, "template": self.template, "source": self.source,
                "fallback": self.fallback, "seconds": round(self.seconds, 3), **self.summary(),
                "fallback_tensors": [{"name": t.name, "type": t.type, "blocks": t.blocks,
                                      "missed_blocks": t.blocks - t.exact_blocks, "reason": t.reason}
                                     for t in self.tensors if t.status == "fallback"],
                "tensors": [asdict(t) for t in self.tensors]}


def _nbytes(t: TensorResult) -> int:
    n = int(np.prod(t.shape))
    qt = GGMLQuantizationType[t.type]
    block, size = quants.GGML_QUANT_SIZES[qt]
    return n // block * size


def quantizable(name: str, shape: tuple[int, ...], template_type: GGMLQuantizationType, all_f32: bool) -> bool:
    """Would llama.cpp's converter quantize this tensor? Its template type says so (it keeps F32
    for norms, 1-D tensors and a list of special tensors), plus Q4_0's block-size rule."""
    if not eligible_shape(shape) or not name.endswith(".weight") or name.endswith("_norm.weight"):
        return False
    return template_type != F32 or all_f32


class ValueSource:
    """Exact source values by GGUF tensor name: float32, or bf16 as uint16 bit patterns."""

    label = "none"

    def get(self, name: str, shape: tuple[int, ...]) -> tuple[np.ndarray | None, str | None]:
        raise NotImplementedError


class GGUFValues(ValueSource):
    """Values from a lossless (F32/F16/BF16) GGUF, e.g. the converter's ``--outtype bf16`` file."""

    def __init__(self, f: GGUFFile) -> None:
        self.file = f
        self.tensors = {t.name: t for t in f.tensors}
        self.label = f"gguf:{f.path}"

    def get(self, name: str, shape: tuple[int, ...]) -> tuple[np.ndarray | None, str | None]:
        t = self.tensors.get(name)
        if t is None:
            return None, "not in the source GGUF"
        if t.type == BF16:  # bf16 bits as stored; widened chunk by chunk where needed
            return _fit(self.file.data(t).view("<u2").reshape(t.shape), shape)
        arr = self.file.float32(t)
        if arr is None:
            return None, f"source tensor is {t.type.name}, not lossless"
        return _fit(arr, shape)


class SafetensorsValues(ValueSource):
    """Values straight from the checkpoint's safetensors, under the converter's GGUF names."""

    def __init__(self, model_dir: Path, names: dict[str, str | None]) -> None:
        from edgekit.models.safetensors import open_model

        files = open_model(model_dir)
        self.by_gguf = {g: (files[h], h) for h, g in names.items() if g is not None and h in files}
        self.label = f"safetensors:{model_dir}"

    def get(self, name: str, shape: tuple[int, ...]) -> tuple[np.ndarray | None, str | None]:
        hit = self.by_gguf.get(name)
        if hit is None:
            return None, "no source tensor maps to this name"
        st, hf_name = hit
        dtype = st.tensors[hf_name].dtype
        if dtype not in ("BF16", "F16", "F32"):
            return None, f"source dtype {dtype}"
        return _fit(st.raw(hf_name) if dtype == "BF16" else st.float32(hf_name), shape)


def _fit(arr: np.ndarray, shape: tuple[int, ...]) -> tuple[np.ndarray | None, str | None]:
    """The converter trims padding rows off embeddings (vocab); anything else must match."""
    if arr.shape == shape:
        return arr, None
    if arr.ndim == len(shape) and arr.shape[1:] == shape[1:] and arr.shape[0] >= shape[0]:
        return arr[: shape[0]], None
    return None, f"source shape {arr.shape} does not match {shape}"


def _q8_estimate(f: GGUFFile, all_f32: bool) -> int:
    """What the converter's ``--outtype q8_0`` file would weigh, from a template it wrote.

    It quantizes exactly the tensors it did not keep F32 (Q8_0, or F16 when a row does not split
    into blocks of 32); the header is the template's (only general.file_type differs).
    """
    total = f.data_start
    for t in f.tensors:
        n = int(np.prod(t.ne))
        if all_f32:
            converted = len(t.ne) >= 2 and t.name.endswith(".weight") and not t.name.endswith("_norm.weight")
        else:
            converted = t.type != F32
        q8_bytes = n // BLOCK * _Q8_BLOCK_BYTES if t.ne[0] % BLOCK == 0 else n * 2
        nbytes = q8_bytes if converted else t.nbytes
        total += nbytes + (-nbytes % f.alignment)
    return total


def repack_gguf(template: GGUFFile, values: ValueSource, out: Path, fallback: str = "Q8_0",
                q8_reference: Path | None = None) -> RepackReport:
    """Write ``out`` from ``template`` with exact Q4_0 where the source allows; see module doc."""
    t0 = time.perf_counter()
    if fallback not in FALLBACKS:
        raise EdgekitError(f"Fallback type must be one of {', '.join(FALLBACKS)}, not {fallback!r}.")
    fb_type = FALLBACKS[fallback]
    if not template.arch:
        raise EdgekitError(f"{template.path} has no general.architecture.")
    all_f32 = template.get("general.file_type") == LlamaFileType.ALL_F32
    report = RepackReport(str(out), str(template.path), values.label, fallback)

    out.parent.mkdir(parents=True, exist_ok=True)
    part = out.with_name(out.name + ".part")
    # Tensor bytes go to a scratch file first (the header needs every tensor's final type), then
    # stream into the GGUF through a memory map: memory stays at about one tensor.
    fd, scratch_name = tempfile.mkstemp(prefix=".repack-", dir=out.parent)
    scratch = Path(scratch_name)
    layout: list[tuple[str, tuple[int, ...], GGMLQuantizationType]] = []
    spans: list[tuple[int, int]] = []
    try:
        with os.fdopen(fd, "wb") as fh:
            for t in template.tensors:
                data, qtype, result = _one_tensor(template, t, values, fb_type, all_f32)
                report.tensors.append(result)
                spans.append((fh.tell(), data.nbytes))
                np.ascontiguousarray(data).tofile(fh)
                layout.append((t.name, t.ne, qtype))
        any_q4 = any(r.status == "exact" for r in report.tensors)
        overrides = {"general.file_type": int(LlamaFileType.MOSTLY_Q4_0)} if any_q4 else {}
        mm = np.memmap(scratch, dtype=np.uint8, mode="r") if scratch.stat().st_size else np.zeros(0, np.uint8)
        write_gguf(part, template, layout, (mm[a : a + n] for a, n in spans), overrides)
        del mm
        os.replace(part, out)
    except BaseException:
        part.unlink(missing_ok=True)
        raise
    finally:
        scratch.unlink(missing_ok=True)

    report.size = out.stat().st_size
    if q8_reference is not None:
        report.q8_0_size, report.q8_0_size_is_estimate = q8_reference.stat().st_size, False
    else:
        report.q8_0_size = _q8_estimate(template, all_f32)
    report.seconds = time.perf_counter() - t0
    return report


def _one_tensor(template: GGUFFile, t: TensorInfo, values: ValueSource, fb_type: GGMLQuantizationType,
                all_f32: bool) -> tuple[np.ndarray, GGMLQuantizationType, TensorResult]:
    shape, ne = t.shape, list(t.ne)
    if not quantizable(t.name, shape, t.type, all_f32):
        return template.data(t), t.type, TensorResult(t.name, ne, t.type.name, "kept")
    src, why = values.get(t.name, shape)
    if src is None:
        # No exact source: the template's own bytes are the best there is.
        return template.data(t), t.type, TensorResult(t.name, ne, t.type.name, "fallback", reason=why)
    try:
        res = exact_q4_0(src, prove=True)
    except AssertionError:  # cannot happen if the search is right; never write a wrong Q4_0 tensor
        raise EdgekitError(f"Internal error: Q4_0 of {t.name} does not dequantize to its source.") from None
    if res.exact:
        assert res.packed is not None
        return res.packed, Q4_0, TensorResult(t.name, ne, "Q4_0", "exact", res.blocks, res.exact_blocks, True)
    reason = f"{res.blocks - res.exact_blocks} of {res.blocks} blocks off the 4-bit grid"
    # Always from the source values, never the template's bytes: the template may come from
    # another copy of the weights, and the report must describe what OUT holds.
    f32 = widen(src)
    data = f32.astype(np.float16) if fb_type == F16 else quants.quantize(f32, fb_type)
    return data, fb_type, TensorResult(t.name, ne, fb_type.name, "fallback", res.blocks, res.exact_blocks,
                                       reason=reason)


def write_report(report: RepackReport, path: Path) -> None:
    path.write_text(json.dumps(report.to_dict(), indent=2) + "\n")
