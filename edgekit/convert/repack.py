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
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter, LlamaFileType, quants

from edgekit.convert.gguf_io import field_value, logical_shape, open_gguf, tensor_f32
from edgekit.convert.qat import BLOCK, bits_equal, eligible_shape, exact_q4_0
from edgekit.errors import EdgekitError

Q4_0 = GGMLQuantizationType.Q4_0
Q8_0 = GGMLQuantizationType.Q8_0
F16 = GGMLQuantizationType.F16
F32 = GGMLQuantizationType.F32
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
    bit_exact: bool | None = None  # Q4_0 dequantized == source, checked after packing
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


def quantizable(name: str, shape: tuple[int, ...], template_type: int, all_f32: bool) -> bool:
    """Would llama.cpp's converter quantize this tensor? Its template type says so (it keeps F32
    for norms, 1-D tensors and a list of special tensors), plus Q4_0's block-size rule."""
    if not eligible_shape(shape) or not name.endswith(".weight") or name.endswith("_norm.weight"):
        return False
    return template_type != F32 or all_f32


class ValueSource:
    """Exact float32 source values by GGUF tensor name."""

    label = "none"

    def get(self, name: str, shape: tuple[int, ...]) -> tuple[np.ndarray | None, str | None]:
        raise NotImplementedError


class GGUFValues(ValueSource):
    """Values from a lossless (F32/F16/BF16) GGUF, e.g. the converter's ``--outtype bf16`` file."""

    def __init__(self, reader: GGUFReader, path: Path) -> None:
        self.tensors = {t.name: t for t in reader.tensors}
        self.label = f"gguf:{path}"

    def get(self, name: str, shape: tuple[int, ...]) -> tuple[np.ndarray | None, str | None]:
        t = self.tensors.get(name)
        if t is None:
            return None, "not in the source GGUF"
        arr = tensor_f32(t)
        if arr is None:
            return None, f"source tensor is {GGMLQuantizationType(t.tensor_type).name}, not lossless"
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
        if st.tensors[hf_name].dtype not in ("BF16", "F16", "F32"):
            return None, f"source dtype {st.tensors[hf_name].dtype}"
        return _fit(st.float32(hf_name), shape)


def _fit(arr: np.ndarray, shape: tuple[int, ...]) -> tuple[np.ndarray | None, str | None]:
    """The converter trims padding rows off embeddings (vocab); anything else must match."""
    if arr.shape == shape:
        return arr, None
    if arr.ndim == len(shape) and arr.shape[1:] == shape[1:] and arr.shape[0] >= shape[0]:
        return arr[: shape[0]], None
    return None, f"source shape {arr.shape} does not match {shape}"


def _copy_fields(reader: GGUFReader, writer: GGUFWriter, file_type: int) -> None:
    for f in reader.fields.values():
        if f.name.startswith("GGUF.") or f.name == "general.architecture":
            continue  # written by GGUFWriter itself
        if f.name == "general.file_type":
            writer.add_uint32(f.name, file_type)
            continue
        vtype = f.types[0]
        sub = f.types[-1] if vtype == GGUFValueType.ARRAY else None
        writer.add_key_value(f.name, f.contents(), vtype, sub_type=sub)
    if "general.file_type" not in reader.fields:
        writer.add_uint32("general.file_type", file_type)


def _q8_estimate(reader: GGUFReader, all_f32: bool) -> int:
    """What the converter's ``--outtype q8_0`` file would weigh, from a template it wrote.

    It quantizes exactly the tensors it did not keep F32 (Q8_0, or F16 when a row does not split
    into blocks of 32); the header is the template's (only general.file_type differs).
    """
    align = int(field_value(reader, "general.alignment") or 32)
    total = int(reader.data_offset)
    for t in reader.tensors:
        shape = logical_shape(t)
        n = int(np.prod(shape))
        if all_f32:
            converted = len(shape) >= 2 and t.name.endswith(".weight") and not t.name.endswith("_norm.weight")
        else:
            converted = t.tensor_type != F32
        q8_bytes = n // BLOCK * _Q8_BLOCK_BYTES if shape[-1] % BLOCK == 0 else n * 2
        nbytes = q8_bytes if converted else int(t.n_bytes)
        total += -(-nbytes // align) * align
    return total


def repack_gguf(template: Path, values: ValueSource, out: Path, fallback: str = "Q8_0",
                q8_reference: Path | None = None) -> RepackReport:
    """Write ``out`` from ``template`` with exact Q4_0 where the source allows; see module doc."""
    t0 = time.perf_counter()
    if fallback not in FALLBACKS:
        raise EdgekitError(f"Fallback type must be one of {', '.join(FALLBACKS)}, not {fallback!r}.")
    fb_type = FALLBACKS[fallback]
    reader = open_gguf(template)
    arch = field_value(reader, "general.architecture")
    if not arch:
        raise EdgekitError(f"{template} has no general.architecture.")
    all_f32 = field_value(reader, "general.file_type") == LlamaFileType.ALL_F32
    align = int(field_value(reader, "general.alignment") or 32)
    report = RepackReport(str(out), str(template), values.label, fallback)

    out.parent.mkdir(parents=True, exist_ok=True)
    part = out.with_name(out.name + ".part")
    # Tensor bytes go to a scratch file first (the header needs every tensor's final type and size),
    # then stream into the GGUF through memory maps: memory stays at about one tensor.
    fd, scratch_name = tempfile.mkstemp(prefix=".repack-", dir=out.parent)
    scratch = Path(scratch_name)
    planned: list[tuple[str, tuple[int, ...], np.dtype, int, GGMLQuantizationType, int]] = []
    try:
        with os.fdopen(fd, "wb") as fh:
            for t in reader.tensors:
                data, qtype, result = _one_tensor(t, values, fb_type, all_f32)
                report.tensors.append(result)
                offset = fh.tell()
                np.ascontiguousarray(data).tofile(fh)
                pad = -data.nbytes % align
                fh.write(b"\0" * pad)
                planned.append((t.name, data.shape, data.dtype, data.nbytes, qtype, offset))
        any_q4 = any(r.status == "exact" for r in report.tensors)
        file_type = LlamaFileType.MOSTLY_Q4_0 if any_q4 else int(field_value(reader, "general.file_type") or 0)

        writer = GGUFWriter(part, arch)
        writer.data_alignment = align
        _copy_fields(reader, writer, int(file_type))
        for name, shape, dtype, nbytes, qtype, _ in planned:
            writer.add_tensor_info(name, shape, dtype, nbytes, raw_dtype=qtype)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        mm = np.memmap(scratch, dtype=np.uint8, mode="r") if scratch.stat().st_size else None
        for _name, _shape, _dtype, nbytes, _qtype, offset in planned:
            chunk = mm[offset : offset + nbytes] if mm is not None and nbytes else np.zeros(0, np.uint8)
            writer.write_tensor_data(chunk)
        writer.close()
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
        report.q8_0_size = _q8_estimate(reader, all_f32)
    report.seconds = time.perf_counter() - t0
    return report


def _one_tensor(t: Any, values: ValueSource, fb_type: GGMLQuantizationType,
                all_f32: bool) -> tuple[np.ndarray, GGMLQuantizationType, TensorResult]:
    shape = logical_shape(t)
    ttype = GGMLQuantizationType(t.tensor_type)
    ne = list(reversed(shape))
    raw = np.asarray(t.data)
    if not quantizable(t.name, shape, ttype, all_f32):
        return raw, ttype, TensorResult(t.name, ne, ttype.name, "kept")
    src, why = values.get(t.name, shape)
    if src is None:
        # No exact source: the template's own bytes are the best there is.
        return raw, ttype, TensorResult(t.name, ne, ttype.name, "fallback", reason=why)
    res = exact_q4_0(src)
    if res.exact:
        assert res.packed is not None
        ok = bits_equal(quants.dequantize(res.packed, Q4_0), src)
        if not ok:  # cannot happen if the search is right; never write a wrong Q4_0 tensor
            raise EdgekitError(f"Internal error: Q4_0 of {t.name} does not dequantize to its source.")
        return res.packed, Q4_0, TensorResult(t.name, ne, "Q4_0", "exact", res.blocks, res.exact_blocks, True)
    reason = f"{res.blocks - res.exact_blocks} of {res.blocks} blocks off the 4-bit grid"
    # Always from the source values, never the template's bytes: the template may come from
    # another copy of the weights, and the report must describe what OUT holds.
    data = src.astype(np.float16) if fb_type == F16 else quants.quantize(src, fb_type)
    return data, fb_type, TensorResult(t.name, ne, fb_type.name, "fallback", res.blocks, res.exact_blocks,
                                       reason=reason)


def write_report(report: RepackReport, path: Path) -> None:
    path.write_text(json.dumps(report.to_dict(), indent=2) + "\n")
