"""A repack template without the bf16 detour: the converter's metadata and small tensors, no big weights.

``_skeleton.py`` runs the pinned converter's own model class but writes only what a Q4_0 repack keeps
from it (metadata, tokenizer, norms, generated tensors), and lists every tensor in the converter's
order with its type. :class:`Skeleton` reads that like the converter's own lossless GGUF, except that
the left-out weights have no bytes: the repack takes them straight from the safetensors, as the
converter would have (it maps Gemma 4's 2-D weights by name, trimming only the embedding's padding
rows). Architectures whose converter transforms 2-D weights in other ways are not allowed here.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType

from edgekit.convert.gguf_io import GGUFFile, TensorInfo, tensor_nbytes
from edgekit.convert.llamacpp import LlamaCpp
from edgekit.errors import EdgekitError

_WORKER = Path(__file__).with_name("_skeleton.py")
# The pinned converter maps these architectures' 2-D weights by name (no permutation, scaling or fusion).
PLAIN_2D_ARCHS = {"gemma4", "gemma4-assistant"}


class NotInSkeleton(EdgekitError):
    """The repack asked for bytes the skeleton left out: use the converter's full lossless file instead."""


@dataclass
class Skeleton:
    """GGUFFile's face for :func:`edgekit.convert.repack.repack_gguf`: every tensor, bytes for the small ones."""

    file: GGUFFile
    tensors: list[TensorInfo]

    @property
    def path(self) -> Path:
        return self.file.path

    @property
    def kv_raw(self) -> dict[str, bytes]:
        return self.file.kv_raw

    @property
    def alignment(self) -> int:
        return self.file.alignment

    @property
    def arch(self) -> str | None:
        return self.file.arch

    def get(self, key: str) -> Any:
        return self.file.get(key)

    def data(self, t: TensorInfo) -> np.ndarray:
        stored = self._stored.get(t.name)
        if stored is None:
            raise NotInSkeleton(f"{t.name} has no bytes in the skeleton")
        return self.file.data(stored)

    def __post_init__(self) -> None:
        self._stored = {t.name: t for t in self.file.tensors}


class SkeletonJob:
    """The worker, started now and collected later, so the weights can be packed meanwhile."""

    def __init__(self, llama: LlamaCpp, model_dir: Path, outtype: str, out: Path, log: Path) -> None:
        self.out, self.log = out, log
        self._log_fh = open(log, "wb")  # noqa: SIM115 - closed in result()
        request = json.dumps({"model": str(model_dir), "outtype": outtype, "out": str(out)})
        self.proc = subprocess.Popen([sys.executable, str(_WORKER), str(llama.root)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self._log_fh, env=llama.env())
        assert self.proc.stdin is not None
        self.proc.stdin.write(request.encode())
        self.proc.stdin.close()

    def result(self) -> Skeleton:
        assert self.proc.stdout is not None
        listing = self.proc.stdout.read()
        rc = self.proc.wait()
        self._log_fh.close()
        if rc != 0:
            tail = (self.log.read_text(errors="replace").strip().splitlines() or ["no output"])[-1]
            raise EdgekitError(f"The pinned converter could not write the repack's metadata: {tail[:300]} "
                               f"(log: {self.log}).")
        doc = json.loads(listing)
        file = GGUFFile(self.out)
        tensors = [TensorInfo(t["name"], tuple(t["ne"]), GGMLQuantizationType(t["type"]), -1,
                              tensor_nbytes(t["ne"], GGMLQuantizationType(t["type"]))) for t in doc["tensors"]]
        if file.arch != doc["arch"]:
            raise EdgekitError(f"The skeleton says {file.arch!r} but the converter maps to {doc['arch']!r}.")
        return Skeleton(file, tensors)

    def cancel(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if not self._log_fh.closed:
            self._log_fh.close()
