"""A Gemma 4 checkpoint's text model alone, as `Gemma4ForCausalLM`: what vLLM serves without vision/audio.

`Gemma4ForConditionalGeneration` keeps the text model under `model.language_model.*` and its config
under `text_config`; vLLM loads it through transformers' `Gemma4Processor`, which needs torchvision
(PyPI's wheels link CUDA, so it cannot load next to CPU torch). The text-only export renames the
tensors to `model.*`, keeps their bytes as they are (no torch, no dtype change: the same weights),
and makes `text_config` the config. Made once per checkpoint, then kept in the store.
"""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

from edgekit.convert.inputs import dir_fingerprint
from edgekit.errors import EdgekitError
from edgekit.models.safetensors import SafetensorsFile, weight_files
from edgekit.store import Store

KIND = "hf-text-only"
WRAPPER = "Gemma4ForConditionalGeneration"
TEXT_PREFIX = "model.language_model."
SIDE_FILES = ("generation_config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
              "chat_template.jinja", "tokenizer.model")


def needs_text_only(model_dir: Path) -> bool:
    config = json.loads((model_dir / "config.json").read_text())
    return WRAPPER in (config.get("architectures") or [])


def text_config(config: dict) -> dict:
    text = dict(config.get("text_config") or {})
    if not text:
        raise EdgekitError(f"The {WRAPPER} config has no text_config; cannot serve its text model alone.")
    text["architectures"] = ["Gemma4ForCausalLM"]
    text["model_type"] = "gemma4_text"
    for key in ("bos_token_id", "eos_token_id", "pad_token_id", "tie_word_embeddings", "dtype"):
        if key in config and key not in text:
            text[key] = config[key]
    return text


def write_text_weights(src: SafetensorsFile, out: Path) -> int:
    """The text tensors of ``src`` renamed to model.*, their bytes copied as they are; returns the count."""
    kept = {name: e for name, e in src.tensors.items() if name.startswith(TEXT_PREFIX)}
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, e in kept.items():
        header["model." + name[len(TEXT_PREFIX):]] = {"dtype": e.dtype, "shape": list(e.shape),
                                                       "data_offsets": [offset, offset + e.end - e.start]}
        offset += e.end - e.start
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the data section starts 8-byte aligned, as safetensors writes it
    with open(src.path, "rb") as fin, open(out, "wb") as fout:
        fout.write(struct.pack("<Q", len(raw)) + raw)
        for e in kept.values():
            fin.seek(src.data_offset + e.start)
            remaining = e.end - e.start
            while remaining:
                chunk = fin.read(min(remaining, 16 << 20))
                fout.write(chunk)
                remaining -= len(chunk)
    return len(kept)


def text_only(model_dir: Path, store: Store | None = None) -> Path:
    """The text-only export of ``model_dir`` (a dir in the store)."""
    store = store or Store()
    key = Store.key({"stage": KIND, "schema": 1, "source": dir_fingerprint(model_dir)})
    if (found := store.get(KIND, key)) is not None:
        return found.path
    files = weight_files(model_dir)
    if len(files) != 1:
        raise EdgekitError(f"{model_dir}: the text-only export takes one safetensors file, not {len(files)}.")
    staging = store.staging_dir()
    try:
        config = json.loads((model_dir / "config.json").read_text())
        (staging / "config.json").write_text(json.dumps(text_config(config), indent=2) + "\n")
        count = write_text_weights(SafetensorsFile(files[0]), staging / "model.safetensors")
        if count == 0:
            raise EdgekitError(f"{model_dir} has no {TEXT_PREFIX}* tensors: not a {WRAPPER} checkpoint.")
        for name in SIDE_FILES:
            if (model_dir / name).is_file():
                shutil.copy2(model_dir / name, staging / name)
        return store.put(KIND, key, staging, {"source": str(model_dir), "tensors": count}).path
    finally:
        shutil.rmtree(staging, ignore_errors=True)
