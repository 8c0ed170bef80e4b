"""A repack template without the bf16 detour: the converter's metadata and small tensors, no big weights.

``_skeleton.py`` runs the pinned converter's own model class but writes only what a Q4_0 repack keeps
from it (metadata, tokenizer, norms, generated tensors), and lists every tensor in the converter's
order with its type. :class:`Skeleton` reads that like the converter's own lossless GGUF, except that
the left-out weights have no bytes: the repack takes them straight from the safetensors, as the
converter would have (it maps Gemma 4's 2-D weights by name, trimming only the embedding's padding
rows). Architectures whose converter transforms 2-D weights in other ways are not allowed here.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType

from edgekit.convert.gguf_io import GGUFFile, TensorInfo, tensor_nbytes
from edgekit.convert.llamacpp import LlamaCpp
from edgekit.errors import EdgekitError
from edgekit.paths import build_dir_once, cache_dir

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


def _from_listing(file: GGUFFile, listing: list[dict[str, Any]]) -> Skeleton:
    tensors = [TensorInfo(t["name"], tuple(t["ne"]), GGMLQuantizationType(t["type"]), -1,
                          tensor_nbytes(t["ne"], GGMLQuantizationType(t["type"]))) for t in listing]
    return Skeleton(file, tensors)


class SkeletonJob:
    """The worker, started now and collected later, so the weights can be packed meanwhile."""

    def __init__(self, llama: LlamaCpp, model_dir: Path, outtype: str, out: Path, log: Path,
                 vocab: Path | None = None) -> None:
        self.out, self.log = out, log
        self._log_fh = open(log, "wb")  # noqa: SIM115 - closed in result()
        request = json.dumps({"model": str(model_dir), "outtype": outtype, "out": str(out),
                              "vocab": str(vocab) if vocab else None})
        self.proc = subprocess.Popen([sys.executable, str(_WORKER), str(llama.root)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self._log_fh, env=llama.env())
        assert self.proc.stdin is not None
        self.proc.stdin.write(request.encode())
        self.proc.stdin.close()

    def result(self) -> Skeleton:
        """The skeleton, as soon as the worker closes its stdout (it may still be filling the vocabulary
        cache: :meth:`finish` waits for that)."""
        assert self.proc.stdout is not None
        listing = self.proc.stdout.read()
        try:
            doc = json.loads(listing)
        except ValueError:
            doc = None
        if not isinstance(doc, dict) or "tensors" not in doc:
            rc = self.proc.wait()
            self._log_fh.close()
            tail = (self.log.read_text(errors="replace").strip().splitlines() or ["no output"])[-1]
            raise EdgekitError(f"The pinned converter could not write the repack's metadata (exit {rc}): "
                               f"{tail[:300]} (log: {self.log}).")
        file = GGUFFile(self.out)
        if file.arch != doc["arch"]:
            raise EdgekitError(f"The skeleton says {file.arch!r} but the converter maps to {doc['arch']!r}.")
        self.listing = doc["tensors"]
        return _from_listing(file, doc["tensors"])

    def finish(self, timeout_s: float = 60.0) -> None:
        """Let the worker end the work it does after the listing (the vocabulary cache), then reap it."""
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=timeout_s)
        self.cancel()

    def cancel(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if not self._log_fh.closed:
            self._log_fh.close()


# ------------------------------------------------------------------------------------------- cache
# A skeleton depends on the converter, the model dir's small files (config, tokenizer, templates), the
# weights' names, shapes and dtypes, and the bytes of the few tensors it holds: not on the big weights.
# A re-fit drafter, a fine-tune or another fallback type of the same model reuses it (the converter's
# imports, AutoConfig and the 262,144-token vocabulary cost ≈ 5 s on one core otherwise).


def _small_files(model_dir: Path) -> list[Path]:
    return sorted(p for p in model_dir.iterdir() if p.is_file() and not p.name.endswith(".safetensors")
                  and not p.name.startswith("."))


def skeleton_key(llama: LlamaCpp, model_dir: Path, outtype: str) -> str:
    from edgekit.models.safetensors import open_model

    digest = hashlib.sha256(f"{llama.identity}\0{outtype}\0".encode() + _WORKER.read_bytes())
    for p in _small_files(model_dir):
        digest.update(p.name.encode() + b"\0" + p.read_bytes())
    for name, st in sorted(open_model(model_dir).items()):
        entry = st.tensors[name]
        digest.update(f"{name}\0{entry.dtype}\0{entry.shape}\n".encode())
    return digest.hexdigest()[:32]


# The tokenizer's tokens, scores and types, which the converter reads one by one (262,144 for Gemma 4; ≈ 2 s
# of the worker's one core), depend on the tokenizer files alone, and every Gemma 4 model (E2B, E4B, their
# assistants, fine-tunes) ships the same ones: a model never seen before still finds them here.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "tokenizer.model")


def vocab_path(llama: LlamaCpp, model_dir: Path) -> Path | None:
    """Where the worker keeps (or finds) ``model_dir``'s token list; None without a tokenizer.json."""
    from importlib.metadata import version

    if not (model_dir / "tokenizer.json").is_file():
        return None
    digest = hashlib.sha256(f"{llama.identity}\0transformers {version('transformers')}\0".encode()
                            + _WORKER.read_bytes())
    for name in TOKENIZER_FILES:
        p = model_dir / name
        digest.update(name.encode() + b"\0" + (p.read_bytes() if p.is_file() else b"-") + b"\0")
    tok_config = json.loads((model_dir / "tokenizer_config.json").read_text()) \
        if (model_dir / "tokenizer_config.json").is_file() else {}
    if "tokenizer_class" not in tok_config:  # transformers then picks the tokenizer by the model's type
        config = json.loads((model_dir / "config.json").read_text())
        digest.update(f"model_type {config.get('model_type')}".encode())
    return cache_dir() / "vocabularies" / f"{digest.hexdigest()[:32]}.npz"


def _held_sources(skeleton: Skeleton, sources: dict[str, Callable[[], bytes]]) -> dict[str, str]:
    """sha256 of the source bytes of every tensor the skeleton holds (generated ones have none)."""
    return {t.name: hashlib.sha256(sources[t.name]()).hexdigest() for t in skeleton.file.tensors if t.name in sources}


def skeleton_cached(key: str) -> bool:
    """Whether a skeleton was made for ``key`` (:func:`cached_skeleton` still checks the tensors it holds)."""
    return (cache_dir() / "skeletons" / key / "listing.json").is_file()


def cached_skeleton(key: str, sources: dict[str, Callable[[], bytes]]) -> Skeleton | None:
    """The skeleton made before for ``key``, if the tensors it holds still have the same source bytes."""
    folder = cache_dir() / "skeletons" / key
    try:
        listing = json.loads((folder / "listing.json").read_text())
        skeleton = _from_listing(GGUFFile(folder / "skeleton.gguf"), listing["tensors"])
    except (OSError, ValueError, KeyError, EdgekitError):
        return None
    return skeleton if _held_sources(skeleton, sources) == listing["held"] else None


def remember_skeleton(key: str, skeleton: Skeleton, listing: list[dict[str, Any]],
                      sources: dict[str, Callable[[], bytes]]) -> None:
    def fill(tmp: Path) -> None:
        shutil.copyfile(skeleton.path, tmp / "skeleton.gguf")
        (tmp / "listing.json").write_text(json.dumps({"tensors": listing, "held": _held_sources(skeleton, sources)}))

    folder = cache_dir() / "skeletons" / key
    if folder.exists():
        shutil.rmtree(folder, ignore_errors=True)  # stale: its held tensors changed
    build_dir_once(folder, "listing.json", fill)
