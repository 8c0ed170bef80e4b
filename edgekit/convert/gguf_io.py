"""GGUF files read and written directly: the header parsed with ``struct``, tensors memory-mapped.

``gguf.GGUFReader`` builds numpy views for every element of every metadata array; on a file with
Gemma's 262,144-token vocabulary that takes longer than converting the weights. This reader keeps
each metadata record's raw bytes, so the repack copies the converter's metadata and tokenizer
byte for byte, and only decodes what is asked for. The format (v3): magic, version, tensor and KV
counts, KV records, tensor infos, padding to ``general.alignment``, tensor data (each aligned).
"""

from __future__ import annotations

import mmap
import struct
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from edgekit.errors import EdgekitError

MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
T_UINT32, T_STRING, T_ARRAY = 4, 8, 9
_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
LOSSLESS = (GGMLQuantizationType.F32, GGMLQuantizationType.F16, GGMLQuantizationType.BF16)


@dataclass(frozen=True)
class TensorInfo:
    name: str
    ne: tuple[int, ...]  # ggml order: ne[0] is the row length
    type: GGMLQuantizationType
    offset: int  # from the start of the data section
    nbytes: int

    @property
    def shape(self) -> tuple[int, ...]:
        """numpy order (rows last)."""
        return tuple(reversed(self.ne))


def tensor_nbytes(ne: Iterable[int], qtype: GGMLQuantizationType) -> int:
    n = int(np.prod(list(ne), dtype=np.int64))
    block, size = GGML_QUANT_SIZES[qtype]
    return n // block * size


class GGUFFile:
    """Metadata (decoded on demand, raw bytes kept) and tensor infos of a GGUF file."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        try:
            with open(self.path, "rb") as fh:
                self._mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        except (OSError, ValueError) as exc:
            raise EdgekitError(f"Cannot read {self.path}: {exc}.") from None
        try:
            self._parse()
        except (struct.error, IndexError, ValueError, UnicodeDecodeError) as exc:
            raise EdgekitError(f"{self.path} is not a valid GGUF file ({exc}).") from None

    def _parse(self) -> None:
        mm = self._mm
        if mm[:4] != MAGIC:
            raise ValueError("bad magic")
        self.version, n_tensors, n_kv = struct.unpack_from("<IQQ", mm, 4)
        if self.version < 2:
            raise ValueError(f"GGUF version {self.version} is too old")
        pos = 24
        self.kv_raw: dict[str, bytes] = {}
        self._kv_at: dict[str, tuple[int, int]] = {}  # key → (value type, offset of the value)
        for _ in range(n_kv):
            start = pos
            key, pos = self._string(pos)
            (vtype,) = struct.unpack_from("<I", mm, pos)
            self._kv_at[key] = (vtype, pos + 4)
            pos = self._skip(vtype, pos + 4)
            self.kv_raw[key] = bytes(mm[start:pos])
        alignment = self.get("general.alignment")
        self.alignment = int(alignment) if alignment else DEFAULT_ALIGNMENT
        self.tensors: list[TensorInfo] = []
        for _ in range(n_tensors):
            name, pos = self._string(pos)
            (n_dims,) = struct.unpack_from("<I", mm, pos)
            ne = struct.unpack_from(f"<{n_dims}Q", mm, pos + 4)
            qtype, offset = struct.unpack_from("<IQ", mm, pos + 4 + 8 * n_dims)
            pos += 4 + 8 * n_dims + 12
            gtype = GGMLQuantizationType(qtype)
            self.tensors.append(TensorInfo(name, tuple(int(x) for x in ne), gtype, offset, tensor_nbytes(ne, gtype)))
        self.data_start = pos + (-pos % self.alignment)
        for t in self.tensors:
            if self.data_start + t.offset + t.nbytes > len(mm):
                raise ValueError(f"tensor {t.name} extends past the end of the file (truncated?)")

    def _string(self, pos: int) -> tuple[str, int]:
        (n,) = struct.unpack_from("<Q", self._mm, pos)
        return self._mm[pos + 8 : pos + 8 + n].decode("utf-8"), pos + 8 + n

    def _skip(self, vtype: int, pos: int) -> int:
        if vtype in _SCALAR:
            return pos + struct.calcsize(_SCALAR[vtype])
        if vtype == T_STRING:
            (n,) = struct.unpack_from("<Q", self._mm, pos)
            return pos + 8 + n
        if vtype == T_ARRAY:
            etype, count = struct.unpack_from("<IQ", self._mm, pos)
            pos += 12
            if etype in _SCALAR:
                return pos + count * struct.calcsize(_SCALAR[etype])
            for _ in range(count):
                pos = self._skip(etype, pos)
            return pos
        raise ValueError(f"unknown metadata type {vtype}")

    def _value(self, vtype: int, pos: int) -> Any:
        if vtype in _SCALAR:
            return struct.unpack_from(_SCALAR[vtype], self._mm, pos)[0]
        if vtype == T_STRING:
            return self._string(pos)[0]
        etype, count = struct.unpack_from("<IQ", self._mm, pos)
        pos += 12
        if etype in _SCALAR:
            return np.frombuffer(self._mm, dtype=np.dtype(_SCALAR[etype]), count=count, offset=pos).tolist()
        out = []
        for _ in range(count):
            out.append(self._value(etype, pos))
            pos = self._skip(etype, pos)
        return out

    def get(self, key: str) -> Any:
        at = self._kv_at.get(key)
        return None if at is None else self._value(*at)

    @property
    def keys(self) -> list[str]:
        return list(self.kv_raw)

    @property
    def arch(self) -> str | None:
        return self.get("general.architecture")

    def data(self, t: TensorInfo) -> np.ndarray:
        """The stored bytes (memory-mapped, no copy)."""
        return np.frombuffer(self._mm, dtype=np.uint8, count=t.nbytes, offset=self.data_start + t.offset)

    def float32(self, t: TensorInfo) -> np.ndarray | None:
        """The tensor as exact float32 if it is stored losslessly (F32/F16/BF16), else None."""
        raw = self.data(t)
        if t.type == GGMLQuantizationType.F32:
            return raw.view("<f4").reshape(t.shape)
        if t.type == GGMLQuantizationType.F16:
            return raw.view("<f2").astype(np.float32).reshape(t.shape)
        if t.type == GGMLQuantizationType.BF16:
            return (raw.view("<u2").astype(np.uint32) << np.uint32(16)).view(np.float32).reshape(t.shape)
        return None


def _gguf_string(s: str) -> bytes:
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def write_gguf(out: Path, template: GGUFFile, tensors: list[tuple[str, tuple[int, ...], GGMLQuantizationType]],
               data: Iterable[np.ndarray], uint32_overrides: dict[str, int] | None = None,
               drop_keys: Iterable[str] = ()) -> None:
    """A GGUF with ``template``'s metadata records copied byte for byte (except ``uint32_overrides``,
    added if missing, and ``drop_keys``), then ``tensors`` (name, ggml ne, type) whose bytes ``data`` yields
    in order."""
    overrides = dict(uint32_overrides or {})
    dropped = set(drop_keys)
    records = []
    for key, raw in template.kv_raw.items():
        if key in dropped:
            continue
        if key in overrides:
            records.append(_gguf_string(key) + struct.pack("<II", T_UINT32, overrides.pop(key)))
        else:
            records.append(raw)
    records += [_gguf_string(k) + struct.pack("<II", T_UINT32, v) for k, v in overrides.items()]
    align = template.alignment
    infos, offset, sizes = [], 0, []
    for name, ne, qtype in tensors:
        nbytes = tensor_nbytes(ne, qtype)
        infos.append(_gguf_string(name) + struct.pack(f"<I{len(ne)}Q", len(ne), *ne)
                     + struct.pack("<IQ", int(qtype), offset))
        sizes.append(nbytes)
        offset += nbytes + (-nbytes % align)
    with open(out, "wb") as fh:
        fh.write(MAGIC + struct.pack("<IQQ", 3, len(tensors), len(records)))
        for r in records:
            fh.write(r)
        for i in infos:
            fh.write(i)
        fh.write(b"\0" * (-fh.tell() % align))
        written = 0
        for arr, nbytes in zip(data, sizes, strict=True):
            if arr.nbytes != nbytes:
                raise ValueError(f"tensor data of {arr.nbytes} bytes where {nbytes} were announced")
            np.ascontiguousarray(arr).tofile(fh)
            fh.write(b"\0" * (-nbytes % align))
            written += 1
        if written != len(tensors):
            raise ValueError("fewer tensor data blocks than tensor infos")


@dataclass
class GGUFInfo:
    path: Path
    arch: str | None
    n_tensors: int
    file_type: int | None
    size: int
    types: dict[str, int] = field(default_factory=dict)
    names: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"arch": self.arch, "tensors": self.n_tensors, "file_type": self.file_type, "size": self.size,
                "types": self.types}


def gguf_info(path: Path) -> GGUFInfo:
    f = GGUFFile(path)
    types = Counter(t.type.name for t in f.tensors)
    return GGUFInfo(Path(path), f.arch, len(f.tensors), f.get("general.file_type"), Path(path).stat().st_size,
                    dict(sorted(types.items())), [t.name for t in f.tensors])


def check_gguf(path: Path, arch: str, expected_names: set[str] | None = None) -> GGUFInfo:
    """The written file has the architecture llama.cpp expects and exactly the expected tensors.

    ``gemma4-assistant`` must be spelled with a hyphen: files written with an underscore by other
    tools do not load in llama.cpp.
    """
    info = gguf_info(path)
    if info.arch != arch:
        raise EdgekitError(f"{path.name} has architecture {info.arch!r}, expected {arch!r}; it would not load "
                           "as intended in llama.cpp.")
    if info.n_tensors == 0:
        raise EdgekitError(f"{path.name} has no tensors.")
    if expected_names is not None:
        have = set(info.names)
        missing, extra = sorted(expected_names - have), sorted(have - expected_names)
        if missing or extra:
            what = f"missing {len(missing)} (e.g. {missing[0]})" if missing else f"{len(extra)} unexpected " \
                   f"(e.g. {extra[0]})"
            raise EdgekitError(f"{path.name} has {info.n_tensors} tensors, expected {len(expected_names)}: {what}.")
    return info
