"""edgekit's first tiny Gemma 4 pair: a text-only target, its MTP assistant drafter, a 400-token tokenizer.

They have the real layouts (``Gemma4ForConditionalGeneration`` and ``Gemma4AssistantForCausalLM``,
per-layer inputs, mixed sliding/full attention, shared KV), so the pinned llama.cpp converter,
llama-server's ``draft-mtp`` and litert-torch treat them exactly like E2B/E4B, in seconds and
without any download. Everything is deterministic in ``seed``.
"""

from __future__ import annotations

from pathlib import Path

from edgekit.models.hfcompat import patch_transformers
from edgekit.tinymodels.grid import qat_copy
from edgekit.tinymodels.tokenizer import BOS_ID, EOS_ID, PAD_ID, write_tokenizer


def target_config(vocab_size: int):  # -> Gemma4Config
    from transformers import Gemma4Config, Gemma4TextConfig

    text = Gemma4TextConfig(
        vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
        num_attention_heads=2, num_key_value_heads=1, head_dim=32, global_head_dim=64,
        layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
        sliding_window=16, vocab_size_per_layer_input=vocab_size, hidden_size_per_layer_input=16,
        num_kv_shared_layers=2, final_logit_softcapping=30.0, max_position_embeddings=2048,
        pad_token_id=PAD_ID, eos_token_id=EOS_ID, bos_token_id=BOS_ID,
    )
    return Gemma4Config(text_config=text, vision_config=None, audio_config=None,
                        pad_token_id=PAD_ID, eos_token_id=EOS_ID, bos_token_id=BOS_ID)


def drafter_config(vocab_size: int, backbone_hidden_size: int = 64):  # -> Gemma4AssistantConfig
    from transformers import Gemma4AssistantConfig, Gemma4TextConfig

    text = Gemma4TextConfig(
        vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, head_dim=32, global_head_dim=64,
        layer_types=["sliding_attention", "full_attention"], sliding_window=16,
        vocab_size_per_layer_input=0, hidden_size_per_layer_input=0, num_kv_shared_layers=2,
        final_logit_softcapping=30.0, max_position_embeddings=2048,
        pad_token_id=PAD_ID, eos_token_id=EOS_ID, bos_token_id=BOS_ID,
    )
    return Gemma4AssistantConfig(text_config=text, backbone_hidden_size=backbone_hidden_size,
                                 pad_token_id=PAD_ID, eos_token_id=EOS_ID, bos_token_id=BOS_ID)


def save_model(model, out_dir: Path, vocab_size: int, layout: str = "legacy") -> Path:
    import torch
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # "Writing model shards" bars are noise in CLI/JSON output

    model = model.to(torch.bfloat16)  # the real QAT checkpoints are bf16 safetensors
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    write_tokenizer(out_dir, vocab_size, layout)
    return out_dir


def make_target(out_dir: Path, seed: int = 0, qat: bool = False) -> Path:
    import torch
    from transformers import Gemma4ForConditionalGeneration

    vocab_size = write_tokenizer(out_dir)
    torch.manual_seed(seed)
    model = Gemma4ForConditionalGeneration(target_config(vocab_size)).eval()
    if qat:
        qat_copy(model, seed)
    return save_model(model, out_dir, vocab_size)


def make_drafter(out_dir: Path, seed: int = 0, qat: bool = False, backbone_hidden_size: int = 64) -> Path:
    import torch
    from transformers import Gemma4AssistantForCausalLM

    patch_transformers()
    vocab_size = write_tokenizer(out_dir)
    torch.manual_seed(seed + 1)
    model = Gemma4AssistantForCausalLM(drafter_config(vocab_size, backbone_hidden_size)).eval()
    # transformers' assisted generation reads this; without it generate(assistant_model=...) fails.
    model.generation_config.num_assistant_tokens = 3
    if qat:
        qat_copy(model, seed + 1)
    return save_model(model, out_dir, vocab_size)


def make_tiny_pair(out_dir: Path, seed: int = 0, qat: bool = False) -> tuple[Path, Path]:
    """Write ``out_dir/target`` and ``out_dir/drafter`` (HF layout, bf16 safetensors, tokenizer)."""
    out_dir = Path(out_dir)
    return (make_target(out_dir / "target", seed, qat), make_drafter(out_dir / "drafter", seed, qat))


def ensure_tiny_pair(root: Path, seed: int = 0, qat: bool = False) -> tuple[Path, Path]:
    """:func:`make_tiny_pair` into ``root/<variant>`` once; later calls reuse it (atomic rename)."""
    from edgekit.paths import build_dir_once

    final = build_dir_once(Path(root) / f"tiny{'-qat' if qat else ''}-s{seed}", "drafter/config.json",
                           lambda tmp: make_tiny_pair(tmp, seed, qat))
    return final / "target", final / "drafter"


__all__ = ["drafter_config", "ensure_tiny_pair", "make_drafter", "make_target", "make_tiny_pair", "save_model",
           "target_config"]
