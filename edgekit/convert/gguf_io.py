"""Reading GGUF files with the ``gguf`` package: summaries, checks, tensors as exact float32."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader

from edgekit.errors import EdgekitError

LOSSLESS = (GGMLQuantizationType.F32, GGMLQuantizationType.F16, GGMLQuantizationType.BF16)


def open_gguf(path: Path) -> GGUFReader:
    try:
        return GGUFReader(path)
    except (ValueError, OSError, IndexError) as exc:
        raise EdgekitError(f"{path} is not a readable GGUF file ({exc}).") from None


def field_value(reader: GGUFReader, key: str) -> Any:
    f = reader.fields.get(key)
    return None if f is None else f.contents()


def logical_shape(tensor: Any) -> tuple[int, ...]:
    """numpy-order shape (rows last = ne0), whatever the storage type."""
    return tuple(int(x) for x in reversed(tensor.shape.tolist()))


def tensor_f32(tensor: Any) -> np.ndarray | None:
    """The tensor as float32 if it is stored losslessly (F32/F16/BF16), else None."""
    shape = logical_shape(tensor)
    t = tensor.tensor_type
    if t == GGMLQuantizationType.F32:
        return np.asarray(tensor.data, dtype=np.float32).reshape(shape)
    if t == GGMLQuantizationType.F16:
        return np.asarray(tensor.data).astype(np.float32).reshape(shape)
    if t == GGMLQuantizationType.BF16:
        bits = np.asarray(tensor.data).view("<u2").reshape(shape)
        return (bits.astype(np.uint32) << np.uint32(16)).view(np.float32)
    return None


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
        return {"path": str(self.path), "arch": self.arch, "tensors": self.n_tensors,
                "file_type": self.file_type, "size": self.size, "types": self.types}


def gguf_info(path: Path) -> GGUFInfo:
    reader = open_gguf(path)
    types = Counter(GGMLQuantizationType(t.tensor_type).name for t in reader.tensors)
    return GGUFInfo(Path(path), field_value(reader, "general.architecture"), len(reader.tensors),
                    field_value(reader, "general.file_type"), Path(path).stat().st_size, dict(sorted(types.items())),
                    [t.name for t in reader.tensors])


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
