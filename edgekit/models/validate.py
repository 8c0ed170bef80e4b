"""Check a model directory (and a target/drafter pair) before any conversion minutes are spent."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgekit.errors import EdgekitError
from edgekit.models.safetensors import open_model

TARGET_ARCHS = ("Gemma4ForConditionalGeneration", "Gemma4ForCausalLM", "Gemma4UnifiedForConditionalGeneration")
DRAFTER_ARCHS = ("Gemma4AssistantForCausalLM", "Gemma4UnifiedAssistantForCausalLM")
ARCHS = {"target": TARGET_ARCHS, "drafter": DRAFTER_ARCHS}
# What llama.cpp writes as general.architecture for each (the assistant with a hyphen).
GGUF_ARCH = {"Gemma4ForConditionalGeneration": "gemma4", "Gemma4ForCausalLM": "gemma4",
             "Gemma4UnifiedForConditionalGeneration": "gemma4", "Gemma4AssistantForCausalLM": "gemma4-assistant",
             "Gemma4UnifiedAssistantForCausalLM": "gemma4-assistant"}


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
    towers: tuple[str, ...] = ()  # "vision", "audio": the multimodal towers the checkpoint has
    ordered_head: dict[str, int] | None = None  # an assistant's centroid-masked head: num_centroids, top_k
    chat_template: bool = False  # its tokenizer carries one (instruction-tuned): health and bench go through it

    @property
    def head_tokens(self) -> int:
        """How many tokens the drafter's own head scores per step (all, or its top-k centroids' share)."""
        if not self.ordered_head:
            return self.vocab_size
        return self.ordered_head["top_k"] * (self.vocab_size // self.ordered_head["num_centroids"])

    @property
    def gguf_arch(self) -> str:
        return GGUF_ARCH[self.architecture]

    def to_dict(self) -> dict[str, Any]:
        d = self.__dict__.copy()
        d["path"] = str(self.path)
        d["dtypes"] = list(self.dtypes)
        d["towers"] = list(self.towers)
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
                     tuple(sorted({e.dtype for e in entries})), len(entries), n_params,
                     towers=_towers(path, cfg, set(tensors)),
                     ordered_head=_ordered_head(path, cfg, vocab, set(tensors)),
                     chat_template=has_chat_template(path))


def has_chat_template(path: Path) -> bool:
    """Whether the checkpoint's tokenizer has a chat template: its own file, or in tokenizer_config.json."""
    if (path / "chat_template.jinja").is_file():
        return True
    config = path / "tokenizer_config.json"
    try:
        return bool(config.is_file() and json.loads(config.read_text()).get("chat_template"))
    except (OSError, ValueError):
        return False


def _towers(path: Path, cfg: dict[str, Any], names: set[str]) -> tuple[str, ...]:
    """The towers a multimodal config declares, each checked to be in the weights. The 12B ("Unified") has none:
    its images and audio enter through projections (``model.embed_vision``/``embed_audio``) that edgekit does
    not serve yet: it serves the text model."""
    if (cfg.get("architectures") or [""])[0] == "Gemma4UnifiedForConditionalGeneration":
        return ()
    found = []
    for tower in ("vision", "audio"):
        if not cfg.get(f"{tower}_config"):
            continue
        if not any(n.startswith(f"model.{tower}_tower.") for n in names):
            raise EdgekitError(f"The target {path.name} declares an {tower} tower ({tower}_config) but its weights "
                               f"have no model.{tower}_tower.* tensors: the checkpoint is incomplete.")
        found.append(tower)
    return tuple(found)


def _ordered_head(path: Path, cfg: dict[str, Any], vocab: int, names: set[str]) -> dict[str, int] | None:
    """An assistant's ordered embeddings (centroid-masked head), checked against its vocabulary and weights."""
    if not cfg.get("use_ordered_embeddings"):
        return None
    try:
        centroids, top_k = int(cfg.get("num_centroids", 2048)), int(cfg.get("centroid_intermediate_top_k", 32))
    except (TypeError, ValueError):
        raise EdgekitError(f"{path / 'config.json'} has a num_centroids or centroid_intermediate_top_k that is "
                           "not a whole number.") from None
    if centroids <= 0 or vocab % centroids:
        raise EdgekitError(f"The drafter {path.name} uses ordered embeddings with num_centroids {centroids}, which "
                           f"does not divide its vocabulary of {vocab} tokens: each centroid must own vocab / "
                           "num_centroids tokens.")
    if not 0 < top_k <= centroids:
        raise EdgekitError(f"The drafter {path.name} picks centroid_intermediate_top_k {top_k} of {centroids} "
                           "centroids: it must be between 1 and num_centroids.")
    missing = [n for n in ("masked_embedding.centroids.weight", "masked_embedding.token_ordering") if n not in names]
    if missing:
        raise EdgekitError(f"The drafter {path.name} uses ordered embeddings but its weights lack "
                           f"{', '.join(missing)}.")
    return {"num_centroids": centroids, "top_k": top_k}


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
