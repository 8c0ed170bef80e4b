"""Tiny models with the structure of the published gemma-4-E2B-it / E4B-it and their assistants, only small.

Read from the published configs (``edgekit/data/gemma4-configs``): the same classes and switches (vision and
audio towers with clipped linears, ``use_double_wide_mlp``, per-layer inputs, proportional partial RoPE on
full layers, ``eos_token_id: [1, 106]``), the same sliding/full period (4:1 for E2B, 5:1 for E4B) and a
KV-shared split that, as published, ends on a full layer. Assistants have ordered embeddings
(``masked_embedding.centroids`` + ``token_ordering``, a real permutation). What is small: widths, two periods
of layers, a 512-token vocabulary, one-layer towers. The audio tower keeps the published width: llama.cpp's
``gemma4a`` graph asserts (``ggml_can_mul_mat``) on a narrower conformer (hidden 64, subsampling [8, 2]; tried
with the pinned llama.cpp, 0c1e570), and works with the published hidden 1024, 8 heads, subsampling [128, 32].
"""

from __future__ import annotations

import json
from pathlib import Path

from edgekit.models.gemma4_configs import published_config
from edgekit.models.hfcompat import patch_transformers
from edgekit.tinymodels.grid import qat_copy, snap_to_grid
from edgekit.tinymodels.legacy import save_model
from edgekit.tinymodels.tokenizer import END_OF_TURN_ID, media_token_ids, write_tokenizer

VARIANTS = {"e2b": "gemma-4-E2B-it", "e4b": "gemma-4-E4B-it", "31b": "gemma-4-31B-it", "26b-a4b": "gemma-4-26B-A4B-it",
            "12b": "gemma-4-12B-it"}
UNIFIED = ("12b",)  # Gemma4UnifiedForConditionalGeneration: no towers, images and audio through projections
VOCAB = 512
PERIODS = 2  # layers = two sliding/full periods; the first is KV-owning, the second KV-shared
NUM_CENTROIDS = 16  # 512 / 16 = 32 tokens per centroid
CENTROID_TOP_K = 4  # 4 of 16 centroids: the head scores 128 of 512 tokens, as published scores 4096 of 262144
# The widths made small; every switch, the layer pattern and max_position_embeddings stay as published (so the
# bench's long-context points reach 32 k on these too).
TEXT = dict(hidden_size=64, intermediate_size=128, num_attention_heads=2, head_dim=32, global_head_dim=64,
            hidden_size_per_layer_input=16, sliding_window=16)
# The 31B: no per-layer inputs, a 4× MLP, separate KV heads for the full layers (K = V there: attention_k_eq_v).
TEXT_31B = dict(hidden_size=64, intermediate_size=256, num_attention_heads=2, num_key_value_heads=2,
                num_global_key_value_heads=1, head_dim=32, global_head_dim=64, sliding_window=16)
# The 26B-A4B: the 31B's attention, and a mixture of experts beside a shared MLP in every layer (published: 128
# experts, top 8, each 704 wide; the shared one `intermediate_size`). Here 8 experts, top 2.
TEXT_26B_A4B = {**TEXT_31B, "intermediate_size": 128, "num_experts": 8, "top_k_experts": 2, "moe_intermediate_size": 32}
# The 12B ("Unified"): the 31B's attention with one KV head on its full layers, a 4× MLP.
TEXT_12B = {**TEXT_31B, "num_key_value_heads": 2, "num_global_key_value_heads": 1}
TEXT_BY_VARIANT = {"e2b": TEXT, "e4b": TEXT, "31b": TEXT_31B, "26b-a4b": TEXT_26B_A4B, "12b": TEXT_12B}
# The Unified model's image and audio inputs: a patch projection and an embedding projection each, small.
UNIFIED_VISION = dict(mm_embed_dim=64, output_proj_dims=64, mm_posemb_size=16)
UNIFIED_AUDIO = dict(audio_embed_dim=32)
ASSISTANT_TEXT = dict(hidden_size=32, intermediate_size=64, num_attention_heads=2, head_dim=32, global_head_dim=64,
                      sliding_window=16)
VISION = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=2,
              num_key_value_heads=2, head_dim=32, global_head_dim=32)
AUDIO = dict(num_hidden_layers=1)
# Config keys that describe a saved file, not the structure.
_NOISE = {"_name_or_path", "architectures", "dtype", "id2label", "label2id", "transformers_version",
          "output_attentions", "output_hidden_states", "problem_type", "return_dict", "chunk_size_feed_forward",
          "is_encoder_decoder"}


def _clean(cfg: dict) -> dict:
    return {k: v for k, v in cfg.items() if k not in _NOISE}


def tiny_layers(layer_types: list[str]) -> list[str]:
    """``PERIODS`` periods of the published sliding/full pattern (the period ends on its full layer)."""
    period = layer_types.index("full_attention") + 1
    unit = layer_types[:period]
    assert all(t == unit[i % period] for i, t in enumerate(layer_types)), "published layers are periodic"
    return unit * PERIODS


def _unified_target_config(variant: str, vocab_size: int):  # -> Gemma4UnifiedConfig
    from transformers.models.gemma4_unified import configuration_gemma4_unified as unified

    patch_transformers()
    pub = published_config(VARIANTS[variant])
    layers = tiny_layers(pub["text_config"]["layer_types"])
    text = unified.Gemma4UnifiedTextConfig(**{**_clean(pub["text_config"]), **TEXT_BY_VARIANT[variant],
                                              "vocab_size": vocab_size, "layer_types": layers,
                                              "num_hidden_layers": len(layers)})
    vision = unified.Gemma4UnifiedVisionConfig(**{**_clean(pub["vision_config"]), **UNIFIED_VISION})
    audio = unified.Gemma4UnifiedAudioConfig(**{**_clean(pub["audio_config"]), **UNIFIED_AUDIO})
    top = {k: v for k, v in _clean(pub).items() if k not in ("text_config", "vision_config", "audio_config")}
    media = media_token_ids(vocab_size)
    top.update(media, eoa_token_index=media["eoa_token_id"], eos_token_id=[text.eos_token_id, END_OF_TURN_ID])
    return unified.Gemma4UnifiedConfig(text_config=text, vision_config=vision, audio_config=audio, **top)


def target_config(variant: str, vocab_size: int = VOCAB):  # -> Gemma4Config (Gemma4UnifiedConfig for the 12B)
    from transformers import Gemma4AudioConfig, Gemma4Config, Gemma4TextConfig, Gemma4VisionConfig

    if variant in UNIFIED:
        return _unified_target_config(variant, vocab_size)
    pub = published_config(VARIANTS[variant])
    pub_text = pub["text_config"]
    layers = tiny_layers(pub_text["layer_types"])
    per_layer = bool(pub_text["hidden_size_per_layer_input"])
    shared = len(layers) // PERIODS if pub_text["num_kv_shared_layers"] else 0  # the second period, where shared
    text = Gemma4TextConfig(**{**_clean(pub_text), **TEXT_BY_VARIANT[variant], "vocab_size": vocab_size,
                               "vocab_size_per_layer_input": vocab_size if per_layer else 0, "layer_types": layers,
                               "num_hidden_layers": len(layers), "num_kv_shared_layers": shared})
    vision = Gemma4VisionConfig(**{**_clean(pub["vision_config"]), **VISION})
    audio = (Gemma4AudioConfig(**{**_clean(pub["audio_config"]), **AUDIO, "output_proj_dims": text.hidden_size})
             if pub.get("audio_config") else None)  # the 31B has no audio tower
    top = {k: v for k, v in _clean(pub).items() if k not in ("text_config", "vision_config", "audio_config")}
    media = media_token_ids(vocab_size)
    if audio is None:
        media = {k: v for k, v in media.items() if k in ("image_token_id", "boi_token_id", "eoi_token_id",
                                                         "video_token_id")}
    else:
        top["eoa_token_index"] = media["eoa_token_id"]
    top.update(media, eos_token_id=[text.eos_token_id, END_OF_TURN_ID])
    return Gemma4Config(text_config=text, vision_config=vision, audio_config=audio, **top)


def assistant_config(variant: str, vocab_size: int = VOCAB, text: dict | None = None,
                     centroids: tuple[int, int] = (NUM_CENTROIDS, CENTROID_TOP_K)):  # -> Gemma4AssistantConfig
    """``text`` overrides the tiny widths (a benchmark's published hidden size); ``centroids``: (count, top k)."""
    from transformers import Gemma4AssistantConfig, Gemma4TextConfig

    patch_transformers()
    if variant in UNIFIED:
        from transformers.models.gemma4_unified import configuration_gemma4_unified as unified
        from transformers.models.gemma4_unified_assistant import configuration_gemma4_unified_assistant as ua

        Gemma4TextConfig, Gemma4AssistantConfig = unified.Gemma4UnifiedTextConfig, ua.Gemma4UnifiedAssistantConfig
    pub = published_config(f"{VARIANTS[variant]}-assistant")
    target_text = target_config(variant, vocab_size).text_config
    # It reads the target's KV cache through views of its own head counts: they must be the target's.
    tiny = {**published_config(VARIANTS[variant])["text_config"], **TEXT_BY_VARIANT[variant]}
    heads = {k: tiny[k] for k in ("num_key_value_heads", "num_global_key_value_heads") if tiny.get(k)}
    text_cfg = Gemma4TextConfig(**{**_clean(pub["text_config"]), **ASSISTANT_TEXT, **(text or {}),
                                   "vocab_size": vocab_size, **heads})
    top = {k: v for k, v in _clean(pub).items() if k != "text_config"}
    top.update(media_token_ids(vocab_size), backbone_hidden_size=target_text.hidden_size)
    if pub.get("use_ordered_embeddings"):
        top.update(num_centroids=centroids[0], centroid_intermediate_top_k=centroids[1])
    return Gemma4AssistantConfig(text_config=text_cfg, **top)


def _is_text(name: str) -> bool:
    return ".language_model." in f".{name}" or name.startswith("lm_head")


def _target_class(variant: str):  # -> type[Gemma4ForConditionalGeneration]
    if variant in UNIFIED:
        from transformers.models.gemma4_unified.modeling_gemma4_unified import Gemma4UnifiedForConditionalGeneration

        return Gemma4UnifiedForConditionalGeneration
    from transformers import Gemma4ForConditionalGeneration

    return Gemma4ForConditionalGeneration


def make_target(out_dir: Path, variant: str, seed: int = 0, qat: bool = False, vocab: int = VOCAB) -> Path:
    import torch

    vocab_size = write_tokenizer(out_dir, vocab, layout="gemma4")
    torch.manual_seed(seed)
    model = _target_class(variant)(target_config(variant, vocab_size)).eval()
    _decisive_routers(model, seed)
    if qat:  # the QAT checkpoints train the text model on the grid; the towers stay as they are
        qat_copy(model, seed, keep=_is_text)
    if variant not in UNIFIED:  # the Unified model has no vision tower for llama.cpp's mmproj to convert
        _write_preprocessor(out_dir, model.config)
    save_model(model, out_dir, vocab_size, layout="gemma4")
    _add_unused_kv(out_dir, model.config.text_config, seed, qat)
    published_style(out_dir / "config.json")
    return out_dir


def make_assistant(out_dir: Path, variant: str, seed: int = 0, qat: bool = False, vocab: int = VOCAB,
                   text: dict | None = None, centroids: tuple[int, int] = (NUM_CENTROIDS, CENTROID_TOP_K)) -> Path:
    """The tiny assistant; ``vocab``, ``text`` and ``centroids`` give a benchmark the published head's shape."""
    import torch
    from transformers import Gemma4AssistantForCausalLM

    patch_transformers()
    if variant in UNIFIED:
        from transformers.models.gemma4_unified_assistant.modeling_gemma4_unified_assistant import (
            Gemma4UnifiedAssistantForCausalLM as Gemma4AssistantForCausalLM,
        )
    vocab_size = write_tokenizer(out_dir, vocab, layout="gemma4")
    torch.manual_seed(seed + 1)
    model = Gemma4AssistantForCausalLM(assistant_config(variant, vocab_size, text, centroids)).eval()
    model.generation_config.num_assistant_tokens = 3  # transformers' assisted generation reads it
    if model.config.use_ordered_embeddings:  # the 31B's assistant has a dense tied head
        with torch.no_grad():  # transformers initialises the ordering to zeros: make it a real permutation
            order = torch.randperm(vocab_size, generator=torch.Generator().manual_seed(seed + 2))
            model.masked_embedding.token_ordering.copy_(order)
    if qat:
        qat_copy(model, seed + 1)
    save_model(model, out_dir, vocab_size, layout="gemma4")
    published_style(out_dir / "config.json")
    return out_dir


ROUTER_STD = 8.0  # expert scores ≈ N(0, 8): margins that ggml's fp16 rounding does not flip (_decisive_routers)


def _decisive_routers(model, seed: int) -> None:  # model: Gemma4ForConditionalGeneration
    """An initialised router (weights ≈ N(0, 0.02)) scores every expert within ≈ 0.02 of the others, so the top-k
    choice turns on rounding: llama.cpp and transformers then route tokens to different experts and their
    outputs part, which says nothing about the conversion. A trained router's scores are spread; so are these,
    enough that the ≈ 4e-4 relative error of ggml's CPU GELU (an fp16 table, vec.h) rarely flips a choice: at
    std 2 the F32 GGUF's top-1 agreement with transformers was 90.5 %, at 8 it is 95.8 % (KL 1.4e-4 → 1.8e-5)."""
    import torch

    g = torch.Generator().manual_seed(seed + 5)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if name.endswith("router.proj.weight"):
                # Scores = proj · (RMS-normed input / √hidden): unit-variance weights × √hidden × ROUTER_STD.
                p.copy_(torch.randn(p.shape, generator=g) * ROUTER_STD)


def published_style(config_json: Path) -> None:
    """Write the full layers' head size (and the 31B's their KV heads) as the published configs do
    (``global_head_dim``, ``num_global_key_value_heads``).

    transformers 5.23 loads ``global_head_dim`` into per-layer overrides and saves those instead
    (``per_layer_config: {"4": {"head_dim": 64}, …}``); users' checkpoints carry the published key, so the
    converters and engines must meet that one.
    """
    doc = json.loads(config_json.read_text())
    text = doc.get("text_config", doc)
    overrides = text.get("per_layer_config") or {}
    keys = {tuple(sorted(o)) for o in overrides.values()}
    dims = {o.get("head_dim") for o in overrides.values()}
    heads = {o.get("num_key_value_heads") for o in overrides.values()}
    full = {i for i, t in enumerate(text.get("layer_types") or []) if t == "full_attention"}
    # The 31B's full layers also have KV heads of their own: published as num_global_key_value_heads.
    if (overrides and keys <= {("head_dim",), ("head_dim", "num_key_value_heads")} and len(keys) == 1
            and len(dims) == 1 and len(heads) == 1 and {int(k) for k in overrides} == full):
        del text["per_layer_config"]
        text["global_head_dim"] = dims.pop()
        if (global_heads := heads.pop()) is not None:
            text["num_global_key_value_heads"] = global_heads
        config_json.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")


def _add_unused_kv(out_dir: Path, text, seed: int, qat: bool) -> None:  # text: Gemma4TextConfig
    """The published KV-shared layers still carry ``k_proj``/``v_proj``/``k_norm``, which transformers ignores:
    so do these, so the converter and the exact repack meet them as they meet the real checkpoints."""
    import torch
    from safetensors.torch import load_file, save_file

    path = out_dir / "model.safetensors"
    tensors = load_file(path)
    g = torch.Generator().manual_seed(seed + 3)
    layer_types = list(text.layer_types)
    first_shared = len(layer_types) - text.num_kv_shared_layers
    for i in range(first_shared, len(layer_types)):
        # Shapes as the last KV-owning layer of the same type has them.
        donor = max(j for j in range(first_shared) if layer_types[j] == layer_types[i])
        pre, src = (f"model.language_model.layers.{n}.self_attn" for n in (i, donor))
        for name in ("k_proj.weight", "v_proj.weight"):
            shape = tensors[f"{src}.{name}"].shape
            w = torch.randn(shape, generator=g) * 0.02
            # llama.cpp's converter writes them into the GGUF: on the grid in a QAT checkpoint, like the rest.
            tensors[f"{pre}.{name}"] = snap_to_grid(w, seed * 1000 + 900 + i) if qat else w.to(torch.bfloat16)
        tensors[f"{pre}.k_norm.weight"] = torch.ones_like(tensors[f"{src}.k_norm.weight"])
    save_file(dict(sorted(tensors.items())), path, metadata={"format": "pt"})


def _write_preprocessor(out_dir: Path, config) -> None:  # config: Gemma4Config
    """``preprocessor_config.json`` as the published checkpoints ship it: llama.cpp's mmproj converter reads
    ``image_mean``/``image_std`` from it (or from ``processor_config.json``) and needs one of the two (checked
    with the pinned llama.cpp, 0c1e570)."""
    vision = config.vision_config
    doc = {"image_processor_type": "Gemma4ImageProcessor", "do_normalize": False, "do_rescale": True,
           "rescale_factor": 1 / 255, "image_mean": [0.0, 0.0, 0.0], "image_std": [1.0, 1.0, 1.0],
           "patch_size": vision.patch_size, "pooling_kernel_size": vision.pooling_kernel_size,
           "max_soft_tokens": config.vision_soft_tokens_per_image,
           "feature_extractor_type": "Gemma4AudioFeatureExtractor", "sampling_rate": 16000}
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "preprocessor_config.json").write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")


__all__ = ["VARIANTS", "assistant_config", "make_assistant", "make_target", "published_config", "target_config",
           "tiny_layers"]
