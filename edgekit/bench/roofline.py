"""The decode roofline: how fast a board could write tokens if it did nothing but read weights.

Decoding one token reads every weight the forward pass uses once, so for one stream

    ceiling tok/s = memory bandwidth / bytes read per token.

Bytes per token come from the GGUF's tensor table (read from the file's header on the board, no
need to fetch the weights): every tensor's size, minus tables that are only looked up one row per
token — ``per_layer_token_embd`` (Gemma 3n / 4 per-layer embeddings) always, ``token_embd`` when
the model has a separate ``output`` matrix (else it is the tied LM head and is read in full) —
and for mixture-of-experts tensors (``*_exps``) only the share of experts used per token. The KV
cache read at long contexts comes on top and is left out, so the ceiling is an upper bound.
Speculative decoding can beat it: it checks several tokens per pass over the weights.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any, BinaryIO

from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
LOOKUP_ONLY = ("per_layer_token_embd.weight",)


class GGUFError(ValueError):
    pass


class _Reader:
    """Buffered reads from any file object (a local file or an SFTP file), header only."""

    def __init__(self, fh: BinaryIO, chunk: int = 1 << 20) -> None:
        self.fh, self.chunk, self.buf, self.pos = fh, chunk, b"", 0

    def read(self, n: int) -> bytes:
        while len(self.buf) - self.pos < n:
            more = self.fh.read(max(self.chunk, n))
            if not more:
                raise GGUFError("the file ends inside the GGUF header")
            self.buf = self.buf[self.pos:] + more
            self.pos = 0
        out = self.buf[self.pos:self.pos + n]
        self.pos += n
        return out

    def unpack(self, fmt: str) -> Any:
        return struct.unpack(fmt, self.read(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        return self.read(self.unpack("<Q")).decode("utf-8", "replace")


def _value(r: _Reader, vtype: int, keep: bool) -> Any:
    if vtype in _SCALARS:
        return r.unpack(_SCALARS[vtype])
    if vtype == _STRING:
        return r.string()
    if vtype == _ARRAY:
        itype, n = r.unpack("<I"), r.unpack("<Q")
        if itype in _SCALARS and not keep:
            r.read(struct.calcsize(_SCALARS[itype]) * n)  # skip numbers in one read
            return None
        items = [_value(r, itype, keep) for _ in range(n)]
        return items if keep else None
    raise GGUFError(f"unknown GGUF value type {vtype}")


@dataclass
class Tensor:
    name: str
    ggml_type: int
    n_elements: int
    nbytes: int


@dataclass
class GGUFInfo:
    arch: str | None
    tensors: list[Tensor]
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def total_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)


def _nbytes(ggml_type: int, n: int) -> int:
    try:
        block, size = GGML_QUANT_SIZES[GGMLQuantizationType(ggml_type)]
    except (ValueError, KeyError):
        raise GGUFError(f"unknown ggml tensor type {ggml_type}") from None
    return n // block * size


def read_header(fh: BinaryIO) -> GGUFInfo:
    r = _Reader(fh)
    if r.read(4) != b"GGUF":
        raise GGUFError("not a GGUF file")
    version = r.unpack("<I")
    if version < 2:
        raise GGUFError(f"GGUF version {version} is too old")
    n_tensors, n_kv = r.unpack("<Q"), r.unpack("<Q")
    meta: dict[str, Any] = {}
    for _ in range(n_kv):
        key, vtype = r.string(), r.unpack("<I")
        small = not key.startswith("tokenizer.")  # skip the vocabulary: large and not needed
        value = _value(r, vtype, keep=small and vtype != _ARRAY)
        if small and vtype != _ARRAY:
            meta[key] = value
    tensors = []
    for _ in range(n_tensors):
        name = r.string()
        dims = [r.unpack("<Q") for _ in range(r.unpack("<I"))]
        ggml_type = r.unpack("<I")
        r.unpack("<Q")  # offset
        n = 1
        for d in dims:
            n *= d
        tensors.append(Tensor(name, ggml_type, n, _nbytes(ggml_type, n)))
    return GGUFInfo(meta.get("general.architecture"), tensors, meta)


def bytes_per_token(info: GGUFInfo) -> tuple[int, list[str]]:
    """Bytes one decode step reads, and how it was counted."""
    names = {t.name for t in info.tensors}
    notes: list[str] = []
    skip = set(LOOKUP_ONLY) & names
    if "output.weight" in names and "token_embd.weight" in names:
        skip.add("token_embd.weight")
        notes.append("token_embd is a lookup (separate output matrix)")
    elif "token_embd.weight" in names:
        notes.append("token_embd counted in full: tied LM head")
    if skip - {"token_embd.weight"}:
        notes.append("per-layer embeddings are a lookup: not counted")
    arch = info.arch or ""
    used, count = info.meta.get(f"{arch}.expert_used_count"), info.meta.get(f"{arch}.expert_count")
    total = 0.0
    for t in info.tensors:
        if t.name in skip:
            continue
        if "_exps" in t.name and used and count:
            total += t.nbytes * used / count
        else:
            total += t.nbytes
    if used and count:
        notes.append(f"experts: {used} of {count} per token")
    return int(total), notes


def roofline(info: GGUFInfo, bandwidth_gbs: float, measured_tps: float | None,
             drafter_tps: float | None = None) -> dict[str, Any]:
    per_token, notes = bytes_per_token(info)
    ceiling = bandwidth_gbs * 1e9 / per_token if per_token else None
    out: dict[str, Any] = {
        "mem_bandwidth_gbs": bandwidth_gbs, "model_bytes": info.total_bytes, "bytes_per_token": per_token,
        "ceiling_tokens_per_second": round(ceiling, 3) if ceiling else None,
        "measured_tokens_per_second": measured_tps,
        "measured_fraction": round(measured_tps / ceiling, 6) if measured_tps and ceiling else None,
        "arch": info.arch, "notes": notes,
    }
    if drafter_tps is not None:
        out["drafter_tokens_per_second"] = drafter_tps
        out["drafter_fraction"] = round(drafter_tps / ceiling, 6) if ceiling else None
    return out


def read_remote_header(runner: Any, path: str) -> GGUFInfo:
    """The GGUF header of a file on the board (SFTP reads only as far as the header goes)."""
    from edgekit.remote.runner import LocalRunner

    if isinstance(runner, LocalRunner):
        with open(path, "rb") as fh:
            return read_header(fh)
    with runner.sftp().open(path, "rb") as fh:
        return read_header(fh)
