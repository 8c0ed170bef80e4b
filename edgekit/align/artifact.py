"""The aligned drafter in the store: a Hugging Face model directory plus a manifest of how it was made.

Kind ``drafter-aligned``; the key covers the target's and the starting drafter's weights (content
hashes), the prompts, every setting and the alignment code itself, so an unchanged request finds its
drafter and anything that would change the result makes a new one.
"""

from __future__ import annotations

import hashlib
import importlib.util
import shutil
from pathlib import Path
from typing import Any

from edgekit.store import Artifact, Store, sha256_file

KIND = "drafter-aligned"
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "special_tokens_map.json",
                    "chat_template.jinja")


def weights_fingerprint(path: Path) -> str:
    """sha256 over config.json and every .safetensors file's content: the model as trained, whatever its name."""
    digest = hashlib.sha256()
    path = Path(path)
    for p in [path / "config.json", *sorted(path.glob("*.safetensors"))]:
        if p.is_file():
            digest.update(f"{p.name}\0{sha256_file(p)}\n".encode())
    return digest.hexdigest()[:24]


# The modules whose code decides the trained weights; a change in any of them changes every key.
_ALIGN_MODULES = ("checkpoint", "continuations", "grid", "objective", "pair", "prompts", "run", "teacher", "train",
                  "unroll")
_RESULT_MODULES = (*(f"edgekit.align.{m}" for m in _ALIGN_MODULES), "edgekit.config.align_spec",
                   "edgekit.models.prompt_lines")


def code_version() -> str:
    """Changes whenever code that shapes the result changes (it is part of every key)."""
    digest = hashlib.sha256()
    for name in _RESULT_MODULES:
        spec = importlib.util.find_spec(name)
        assert spec is not None and spec.origin is not None, name
        digest.update(name.encode() + b"\0" + Path(spec.origin).read_bytes())
    return digest.hexdigest()[:16]


def store_key(target_fp: str, drafter_fp: str, prompts_sha: str, settings: dict[str, Any]) -> str:
    return Store.key({"kind": KIND, "target": target_fp, "drafter": drafter_fp, "prompts": prompts_sha,
                      "settings": settings, "code": code_version()})


def copy_tokenizer(src: Path, dst: Path) -> None:
    for name in _TOKENIZER_FILES:
        if (Path(src) / name).is_file():
            shutil.copy2(Path(src) / name, Path(dst) / name)


def save_drafter(drafter: Any, dtype: str, k: int, source_dir: Path, out_dir: Path) -> None:
    """The drafter as a HF directory in its original dtype, tokenizer alongside, drafting K tokens."""
    import torch

    out_dir.mkdir(parents=True, exist_ok=True)
    model = drafter.to(getattr(torch, dtype, torch.float32))
    model.generation_config.num_assistant_tokens = k  # transformers' assisted generation reads it
    model.save_pretrained(out_dir, safe_serialization=True)
    model.float()
    copy_tokenizer(source_dir, out_dir)


def find(store: Store, key: str) -> Artifact | None:
    art = store.get(KIND, key)
    return art if art is not None and (art.path / "config.json").is_file() else None


__all__ = ["KIND", "code_version", "copy_tokenizer", "find", "save_drafter", "store_key", "weights_fingerprint"]
