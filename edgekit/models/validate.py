"""Check a model directory (and a target/drafter pair) before any conversion minutes are spent."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgekit.errors import EdgekitError
from edgekit.models.safetensors import open_model

TARGET_ARCHS = ("Gemma4ForConditionalGeneration", "Gemma4ForCausalLM")
DRAFTER_ARCHS = ("Gemma4AssistantForCausalLM",)
ARCHS = {"target": TARGET_ARCHS, "drafter": DRAFTER_ARCHS}
# What llama.cpp writes as general.architecture for each (the assistant with a hyphen).
GGUF_ARCH = {"Gemma4ForConditionalGeneration": "gemma4", "Gemma4ForCausalLM": "gemma4",
             "Gemma4AssistantForCausalLM": "gemma4-assistant"}


@dataclass(frozen=True)
class ModelInfo:
    path: Path
    role: str
    architecture: str
    hidden_size: int
    vocab_size: int
    num_layers: int
    backbone_hidden_size: int | None
    dtypes: tuple[str, ...]
    n_tensors: int
    n_params: int

    @property
    def gguf_arch(self) -> str:
        return GGUF_ARCH[self.architecture]

    def to_dict(self) -> dict[str, Any]:
        d = self.__dict__.copy()
        d["path"] = str(self.path)
        d["dtypes"] = list(self.dtypes)
        return d


def _config(path: Path) -> dict[str, Any]:
    cfg_path = path / "config.json"
    if not cfg_path.is_file():
        raise EdgekitError(f"{path} has no config.json: it is not a Hugging Face model directory.")
    try:
        cfg = json.loads(cfg_path.read_text())
    except ValueError as exc:
        raise EdgekitError(f"{cfg_path} is not valid JSON ({exc}).") from None
    if not isinstance(cfg, dict):
        raise EdgekitError(f"{cfg_path} is not a JSON object.")
    return cfg


def inspect_model(path: Path, role: str) -> ModelInfo:
    """Architecture known for its role, config sizes present, tokenizer and complete weights on disk."""
    path = Path(path)
    if not path.is_dir():
        raise EdgekitError(f"The {role} model directory {path} does not exist.")
    cfg = _config(path)
    archs = cfg.get("architectures") or []
    arch = archs[0] if archs else None
    if arch not in ARCHS[role]:
        other = "drafter" if role == "target" else "target"
        hint = f" (that is a {other} architecture: swap target and drafter?)" if arch in ARCHS[other] else ""
        raise EdgekitError(f"The {role} {path.name} has architecture {arch or 'none'}; edgekit converts "
                           f"{' or '.join(ARCHS[role])} as a {role}{hint}.")
    text = cfg.get("text_config") or cfg
    try:
        hidden, vocab, layers = int(text["hidden_size"]), int(text["vocab_size"]), int(text["num_hidden_layers"])
    except (KeyError, TypeError, ValueError):
        raise EdgekitError(f"{path / 'config.json'} lacks hidden_size, vocab_size or num_hidden_layers.") from None
    backbone = cfg.get("backbone_hidden_size")
    if role == "drafter" and not isinstance(backbone, int):
        raise EdgekitError(f"The drafter {path.name} has no backbone_hidden_size in its config.json.")
    if not ((path / "tokenizer.json").is_file() or (path / "tokenizer.model").is_file()):
        raise EdgekitError(f"{path} has no tokenizer.json or tokenizer.model; the converter needs one.")
    tensors = open_model(path)  # raises on missing/truncated files
    if not tensors:
        raise EdgekitError(f"{path} has no .safetensors weights.")
    entries = [f.tensors[n] for n, f in tensors.items()]
    n_params = sum(int(_prod(e.shape)) for e in entries)
    return ModelInfo(path, role, arch, hidden, vocab, layers, backbone if role == "drafter" else None,
                     tuple(sorted({e.dtype for e in entries})), len(entries), n_params)


def _prod(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def check_pair(target: ModelInfo, drafter: ModelInfo) -> None:
    """An MTP drafter reads the target's hidden state and emits its tokens: sizes must match."""
    if drafter.backbone_hidden_size != target.hidden_size:
        raise EdgekitError(f"The drafter {drafter.path.name} was trained for a target of hidden size "
                           f"{drafter.backbone_hidden_size}, but the target {target.path.name} has "
                           f"{target.hidden_size}: pick the assistant made for this target.")
    if drafter.vocab_size != target.vocab_size:
        raise EdgekitError(f"The drafter {drafter.path.name} has a vocabulary of {drafter.vocab_size} tokens "
                           f"and the target {target.path.name} one of {target.vocab_size}: they must match.")
