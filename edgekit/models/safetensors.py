"""Safetensors read with numpy only: header checks (truncation) and bf16 tensors as float32.

``safetensors.numpy`` cannot return bf16 (numpy has no such dtype), and the repack needs the exact
bf16 bit patterns anyway, so the format (8-byte header length, JSON header, raw little-endian data)
is read directly through a memory map.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgekit.errors import EdgekitError

_DTYPES = {
    "F64": np.dtype("<f8"), "F32": np.dtype("<f4"), "F16": np.dtype("<f2"), "BF16": np.dtype("<u2"),
    "I64": np.dtype("<i8"), "I32": np.dtype("<i4"), "I16": np.dtype("<i2"), "I8": np.dtype("i1"),
    "U8": np.dtype("u1"), "BOOL": np.dtype("?"),
}
_MAX_HEADER = 100 << 20


@dataclass(frozen=True)
class TensorEntry:
    name: str
    dtype: str
    shape: tuple[int, ...]
    start: int  # offsets into the data section
    end: int


class SafetensorsFile:
    """One .safetensors file; the constructor validates the header against the file size."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        size = self.path.stat().st_size
        where = f"{self.path.parent.name}/{self.path.name}"
        if size < 8:
            raise EdgekitError(f"{where} is truncated ({size} bytes, not even a header).")
        with open(self.path, "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            if n > _MAX_HEADER or 8 + n > size:
                raise EdgekitError(f"{where} is truncated or not a safetensors file (header of {n} bytes "
                                   f"in a {size}-byte file).")
            try:
                header = json.loads(fh.read(n))
            except ValueError:
                raise EdgekitError(f"{where} has a corrupt safetensors header.") from None
        self.data_offset = 8 + n
        self.metadata = header.pop("__metadata__", None) or {}
        self.tensors: dict[str, TensorEntry] = {}
        data_size = size - self.data_offset
        for name, info in header.items():
            start, end = info["data_offsets"]
            dtype = info["dtype"]
            if dtype not in _DTYPES:
                raise EdgekitError(f"{where}: tensor {name} has unsupported dtype {dtype}.")
            shape = tuple(int(x) for x in info["shape"])
            if end > data_size:
                raise EdgekitError(f"{where} is truncated: tensor {name} ends at byte {self.data_offset + end}, "
                                   f"the file has {size} (re-download it).")
            if end - start != int(np.prod(shape, dtype=np.int64)) * _DTYPES[dtype].itemsize:
                raise EdgekitError(f"{where}: tensor {name} has a size that does not match its shape.")
            self.tensors[name] = TensorEntry(name, dtype, shape, start, end)
        self._mm: np.memmap | None = None

    def raw(self, name: str) -> np.ndarray:
        """The stored array (bf16 as uint16 bit patterns), memory-mapped, in the stored shape."""
        entry = self.tensors[name]
        if self._mm is None:
            self._mm = np.memmap(self.path, dtype=np.uint8, mode="r")
        buf = self._mm[self.data_offset + entry.start : self.data_offset + entry.end]
        return buf.view(_DTYPES[entry.dtype]).reshape(entry.shape)

    def float32(self, name: str) -> np.ndarray:
        """The tensor as float32, exactly (bf16 and f16 widen without rounding)."""
        entry = self.tensors[name]
        arr = self.raw(name)
        if entry.dtype == "BF16":
            return (arr.astype(np.uint32) << np.uint32(16)).view(np.float32)
        return arr.astype(np.float32)


def weight_files(model_dir: Path) -> list[Path]:
    """The safetensors files of a model dir: those its index names, else every *.safetensors."""
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (ValueError, KeyError):
            raise EdgekitError(f"{index} is not a valid safetensors index.") from None
        names = sorted(set(weight_map.values()))
        missing = [n for n in names if not (model_dir / n).is_file()]
        if missing:
            raise EdgekitError(f"{model_dir} is missing {len(missing)} weight file(s) named in its index, "
                               f"e.g. {missing[0]}.")
        return [model_dir / n for n in names]
    return sorted(model_dir.glob("*.safetensors"))


def open_model(model_dir: Path) -> dict[str, SafetensorsFile]:
    """Tensor name → the file holding it, for every weight file of a model dir (headers checked)."""
    out: dict[str, SafetensorsFile] = {}
    for path in weight_files(model_dir):
        st = SafetensorsFile(path)
        for name in st.tensors:
            out[name] = st
    return out
