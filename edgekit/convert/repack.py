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
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Protocol

import numpy as np
from gguf import GGMLQuantizationType, LlamaFileType, quants

from edgekit.convert.gguf_io import GGUFFile, TensorInfo, write_gguf
from edgekit.convert.qat import BLOCK, eligible_shape, exact_q4_0, widen
from edgekit.errors import EdgekitError


class Template(Protocol):
    """What a repack takes from the converter's file: GGUFFile, or a Skeleton of it."""

    path: Path
    tensors: list[TensorInfo]

    @property
    def kv_raw(self) -> dict[str, bytes]: ...
    @property
    def alignment(self) -> int: ...
    @property
    def arch(self) -> str | None: ...
    def get(self, key: str) -> Any: ...
    def data(self, t: TensorInfo) -> np.ndarray: ...


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
        # Memory-mapped as stored (bf16 as bits): widened block batch by block batch where needed.
        return _fit(st.raw(hf_name), shape)

    def shapes(self) -> dict[str, tuple[int, ...]]:
        """GGUF name → the stored shape (numpy order) of its source tensor."""
        return {g: st.tensors[h].shape for g, (st, h) in self.by_gguf.items()}


def _fit(arr: np.ndarray, shape: tuple[int, ...]) -> tuple[np.ndarray | None, str | None]:
    """The converter trims padding rows off embeddings (vocab); anything else must match."""
    if arr.shape == shape:
        return arr, None
    if arr.ndim == len(shape) and arr.shape[1:] == shape[1:] and arr.shape[0] >= shape[0]:
        return arr[: shape[0]], None
    return None, f"source shape {arr.shape} does not match {shape}"


def _header_size(f: Template) -> int:
    """Bytes before the tensor data of a GGUF with ``f``'s metadata and tensor list."""
    size = 24 + sum(len(raw) for raw in f.kv_raw.values())
    size += sum(8 + len(t.name.encode()) + 4 + 8 * len(t.ne) + 12 for t in f.tensors)
    return size + (-size % f.alignment)


def _q8_estimate(f: Template, all_f32: bool) -> int:
    """What the converter's ``--outtype q8_0`` file would weigh, from a template it wrote.

    It quantizes exactly the tensors it did not keep F32 (Q8_0, or F16 when a row does not split
    into blocks of 32); the header is the template's (only general.file_type differs).
    """
    total = _header_size(f)
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


@dataclass(frozen=True)
class Packed:
    """One weight packed ahead of its template (while the converter still writes the metadata)."""

    ne: tuple[int, ...]
    qtype: GGMLQuantizationType
    result: TensorResult
    span: tuple[int, int]  # (offset, bytes) in the scratch file


def pack_ahead(values: SafetensorsValues, fallback: str, fh: BinaryIO,
               wanted: Callable[[str], bool] = lambda _n: True,
               threads: Callable[[], int | None] = lambda: None) -> dict[str, Packed]:
    """Pack every weight the repack would quantize, straight from the safetensors, into ``fh``.

    Which weights are quantized is the template's to say; this guesses by name and shape (2-D
    weights, not norms), and :func:`repack_gguf` uses a packed weight only where the template agrees.
    ``threads()``: how many to pack the next tensor with (None: one per CPU, at most 4).
    """
    fb_type = _fallback_type(fallback)
    out: dict[str, Packed] = {}
    for name, shape in values.shapes().items():
        if not wanted(name) or not eligible_shape(shape) or not name.endswith(".weight") \
                or name.endswith("_norm.weight"):
            continue
        src, _why = values.get(name, shape)
        if src is None:
            continue
        ne = tuple(reversed(shape))
        data, qtype, result = _pack(name, list(ne), src, fb_type, threads())
        start = fh.tell()
        np.ascontiguousarray(data).tofile(fh)
        out[name] = Packed(ne, qtype, result, (start, data.nbytes))
    return out


def _fallback_type(fallback: str) -> GGMLQuantizationType:
    if fallback not in FALLBACKS:
        raise EdgekitError(f"Fallback type must be one of {', '.join(FALLBACKS)}, not {fallback!r}.")
    return FALLBACKS[fallback]


def repack_gguf(template: Template, values: ValueSource, out: Path, fallback: str = "Q8_0",
                q8_reference: Path | None = None, ahead: dict[str, Packed] | None = None,
                ahead_file: Path | None = None) -> RepackReport:
    """Write ``out`` from ``template`` with exact Q4_0 where the source allows; see module doc.

    ``ahead``/``ahead_file``: weights :func:`pack_ahead` packed already, used where their shape and
    the template's decision to quantize agree (anything else is packed here as usual).
    """
    t0 = time.perf_counter()
    fb_type = _fallback_type(fallback)
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
    spans: list[tuple[bool, int, int]] = []  # (packed ahead?, offset, bytes)
    pre = np.memmap(ahead_file, dtype=np.uint8, mode="r") if ahead and ahead_file and ahead_file.stat().st_size \
        else None
    try:
        with os.fdopen(fd, "wb") as fh:
            for t in template.tensors:
                hit = (ahead or {}).get(t.name)
                if pre is not None and hit is not None and hit.ne == t.ne \
                        and quantizable(t.name, t.shape, t.type, all_f32):
                    report.tensors.append(hit.result)
                    spans.append((True, *hit.span))
                    layout.append((t.name, t.ne, hit.qtype))
                    continue
                data, qtype, result = _one_tensor(template, t, values, fb_type, all_f32)
                report.tensors.append(result)
                spans.append((False, fh.tell(), data.nbytes))
                np.ascontiguousarray(data).tofile(fh)
                layout.append((t.name, t.ne, qtype))
        any_q4 = any(r.status == "exact" for r in report.tensors)
        overrides = {"general.file_type": int(LlamaFileType.MOSTLY_Q4_0)} if any_q4 else {}
        mm = np.memmap(scratch, dtype=np.uint8, mode="r") if scratch.stat().st_size else np.zeros(0, np.uint8)
        chunks = ((pre if ahead_span else mm)[a : a + n] for ahead_span, a, n in spans)  # type: ignore[index]
        write_gguf(part, template, layout, chunks, overrides)
        del mm, pre
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


def _one_tensor(template: Template, t: TensorInfo, values: ValueSource, fb_type: GGMLQuantizationType,
                all_f32: bool) -> tuple[np.ndarray, GGMLQuantizationType, TensorResult]:
    shape, ne = t.shape, list(t.ne)
    if not quantizable(t.name, shape, t.type, all_f32):
        return template.data(t), t.type, TensorResult(t.name, ne, t.type.name, "kept")
    src, why = values.get(t.name, shape)
    if src is None:
        # No exact source: the template's own bytes are the best there is.
        return template.data(t), t.type, TensorResult(t.name, ne, t.type.name, "fallback", reason=why)
    return _pack(t.name, ne, src, fb_type)


def _pack(name: str, ne: list[int], src: np.ndarray, fb_type: GGMLQuantizationType, threads: int | None = None
          ) -> tuple[np.ndarray, GGMLQuantizationType, TensorResult]:
    """Exact Q4_0 of one weight's source values, or the whole tensor in the fallback type."""
    try:
        res = exact_q4_0(src, prove=True, threads=threads)
    except AssertionError:  # cannot happen if the search is right; never write a wrong Q4_0 tensor
        raise EdgekitError(f"Internal error: Q4_0 of {name} does not dequantize to its source.") from None
    if res.exact:
        assert res.packed is not None
        return res.packed, Q4_0, TensorResult(name, ne, "Q4_0", "exact", res.blocks, res.exact_blocks, True)
    reason = f"{res.blocks - res.exact_blocks} of {res.blocks} blocks off the 4-bit grid"
    # Always from the source values, never the template's bytes: the template may come from
    # another copy of the weights, and the report must describe what OUT holds.
    f32 = widen(src)
    data = f32.astype(np.float16) if fb_type == F16 else quants.quantize(f32, fb_type)
    return data, fb_type, TensorResult(name, ne, fb_type.name, "fallback", res.blocks, res.exact_blocks,
                                       reason=reason)


def write_report(report: RepackReport, path: Path) -> None:
    path.write_text(json.dumps(report.to_dict(), indent=2) + "\n")
