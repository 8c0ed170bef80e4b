"""The target and drafter an alignment run works on: checked for fit first, then loaded for training."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgekit.errors import EdgekitError
from edgekit.models.validate import ModelInfo, check_pair, inspect_model

# Sizes of the shared KV the drafter reads: they must match between the two text configs.
_KV_FIELDS = ("head_dim", "global_head_dim", "num_key_value_heads", "num_global_key_value_heads")


def _text_config(path: Path) -> dict[str, Any]:
    cfg = json.loads((path / "config.json").read_text())
    return cfg.get("text_config") or cfg


def check_models(target_dir: Path, drafter_dir: Path) -> tuple[ModelInfo, ModelInfo]:
    """Architectures, hidden size, vocabulary and shared-KV shapes fit, or one EdgekitError says why not."""
    target = inspect_model(target_dir, "target")
    drafter = inspect_model(drafter_dir, "drafter")
    check_pair(target, drafter)
    t_cfg, d_cfg = _text_config(Path(target_dir)), _text_config(Path(drafter_dir))
    for name in _KV_FIELDS:
        if name in t_cfg and name in d_cfg and t_cfg[name] != d_cfg[name]:
            raise EdgekitError(f"The drafter {drafter.path.name} reads a shared KV cache with {name} {d_cfg[name]}, "
                               f"but the target {target.path.name} writes one with {t_cfg[name]}: "
                               "pick the assistant made for this target's architecture.")
    return target, drafter


def saved_dtype(path: Path) -> str:
    """The dtype the checkpoint is stored in ("bfloat16" for Google's and edgekit's QAT drafters)."""
    cfg = json.loads((Path(path) / "config.json").read_text())
    return str(cfg.get("dtype") or cfg.get("torch_dtype") or (cfg.get("text_config") or {}).get("dtype") or "float32")


def resolve_device(device: str) -> Any:  # -> torch.device
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        raise EdgekitError("--device cuda was asked for, but this torch build sees no CUDA device.")
    if device not in ("cpu", "cuda"):
        raise EdgekitError(f"Unknown device {device!r} (use cpu or cuda).")
    return torch.device(device)


@dataclass
class Pair:
    """Both models in fp32 on one device; the target frozen, the drafter trainable."""

    target: Any  # Gemma4ForConditionalGeneration | Gemma4ForCausalLM
    drafter: Any  # Gemma4AssistantForCausalLM | Gemma4UnifiedAssistantForCausalLM
    tokenizer: Any
    device: Any
    target_info: ModelInfo
    drafter_info: ModelInfo

    @property
    def embed(self) -> Any:
        """The target's scaled token embedding: what the drafter's pre-projection reads (as in llama.cpp)."""
        return self.target.get_input_embeddings()


def load_pair(target_dir: Path, drafter_dir: Path, device: str = "cpu") -> Pair:
    import torch
    import transformers
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    from edgekit.models.hfcompat import patch_transformers

    patch_transformers()
    hf_logging.disable_progress_bar()
    target_info, drafter_info = check_models(target_dir, drafter_dir)
    dev = resolve_device(device)
    target_cls = getattr(transformers, target_info.architecture)
    target = target_cls.from_pretrained(target_dir, dtype=torch.float32).to(dev).eval()
    for p in target.parameters():
        p.requires_grad_(False)
    drafter_cls = getattr(transformers, drafter_info.architecture)  # the 12B's: Gemma4UnifiedAssistantForCausalLM
    drafter = drafter_cls.from_pretrained(drafter_dir, dtype=torch.float32).to(dev)
    tokenizer = AutoTokenizer.from_pretrained(target_dir)
    return Pair(target, drafter, tokenizer, dev, target_info, drafter_info)


__all__ = ["Pair", "check_models", "load_pair", "resolve_device", "saved_dtype"]
