"""Worker run with the pinned llama.cpp tree on sys.path: HF tensor names → the GGUF names its
converter writes. Reads JSON on stdin ``{"config": {...}, "names": [...], "light": bool}``;
writes ``{"arch": ..., "map": {hf: gguf|null}}``.

Default: the converter's own model class (its ``filter_tensors`` skips and renames) and its
gguf-py tensor map, so edgekit keeps no second copy of those rules; importing the converter costs
≈ 3 s (torch, transformers). ``light``: gguf-py's tensor map plus the few Gemma 4 rules of that
class written out below (tests check both modes agree). edgekit answers ``light`` in its own process
with :func:`light_map` over the tree's gguf-py tables (``llamacpp.pinned_tables``); this script's
``light`` is the fallback when those tables cannot be loaded alone.

Run as a script (``python _namemap.py LLAMA_CPP_ROOT``): the vendored gguf-py must shadow any
installed ``gguf``. Importing it only defines the functions below.
"""

import json
import logging
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

LIGHT_ARCHS = {"Gemma4ForConditionalGeneration": "GEMMA4", "Gemma4ForCausalLM": "GEMMA4",
               "Gemma4UnifiedForConditionalGeneration": "GEMMA4", "Gemma4AssistantForCausalLM": "GEMMA4_ASSISTANT",
               "Gemma4UnifiedAssistantForCausalLM": "GEMMA4_ASSISTANT"}
# TextModel.filter_tensors at the pinned commit: multimodal towers are not part of a text GGUF.
_MM_PREFIXES = ("mlp", "vit.", "vpm.", "siglip2.", "conformer.", "merger.", "resampler.", "sound_encoder.",
                "sound_projection.", "speech_embeddings.")
_MM_PARTS = ("visual.", "vision.", "audio.", "talker.", "vision_", "audio_", "token2wav.", "code2wav.",
             "projector.", "pre_mm_projector_norm", "image_newline", "view_seperator", "patch_embed",
             "patch_embedding", "patch_merger.", "patch_merge_mlp.", "model.connector.")


def light_filter(name: str) -> str | None:
    # Gemma4AssistantModel keeps masked_embedding.* (edgekit's llama.cpp patch 0002; the pin dropped it)
    if name.startswith(_MM_PREFIXES) or any(p in name for p in _MM_PARTS):
        return None
    if name.endswith(("per_dim_scale", "layer_scalar")):  # Gemma4Model
        name += ".weight"
    if ".experts." in name and not name.endswith(".weight"):  # Gemma4Model: the MoE's fused expert tensors
        name += ".weight"
    return name.replace("language_model.", "")  # ModelBase


# Gemma4Model.modify_tensors: the MoE router's two scales become GGUF tensors of their own (both modes: the
# class's filter_tensors, which the default mode asks, does not rename them).
_MOE_SCALES = re.compile(r"layers\.(\d+)\.router\.(scale|per_expert_scale)$")


def moe_scale(name: str) -> str | None:
    m = _MOE_SCALES.search(name)
    if m is None:
        return None
    return f"blk.{m.group(1)}.{'ffn_gate_inp' if m.group(2) == 'scale' else 'ffn_down_exps'}.scale"


def main() -> None:
    root = Path(sys.argv[1])
    sys.path[:0] = [str(root / "gguf-py"), str(root)]
    logging.disable(logging.WARNING)
    import gguf

    req = json.load(sys.stdin)
    config = req["config"]
    if req.get("light"):
        try:
            arch, out = light_map(gguf, config, req["names"])
        except ValueError as exc:
            raise SystemExit(str(exc)) from None
        json.dump({"arch": arch, "map": out}, sys.stdout)
        return
    from conversion import ModelType, get_model_architecture, get_model_class

    cls = get_model_class(get_model_architecture(config, ModelType.TEXT))

    def keep(name: str) -> str | None:
        item = cls.filter_tensors((name, lambda: None))
        return None if item is None else item[0]

    out = _mapped(gguf, cls.model_arch, config, req["names"], keep)
    json.dump({"arch": gguf.MODEL_ARCH_NAMES[cls.model_arch], "map": out}, sys.stdout)


def light_map(gguf: Any, config: dict[str, Any], names: list[str]) -> tuple[str, dict[str, str | None]]:
    """(GGUF arch, HF name → GGUF name or None) by the Gemma 4 rules above and ``gguf``'s tensor map.

    ``gguf``: anything with gguf-py's ``MODEL_ARCH``, ``MODEL_ARCH_NAMES`` and ``get_tensor_name_map``.
    """
    hf_arch = (config.get("architectures") or [None])[0]
    if hf_arch not in LIGHT_ARCHS:
        raise ValueError(f"no light name map for {hf_arch}")
    model_arch = gguf.MODEL_ARCH[LIGHT_ARCHS[hf_arch]]
    return gguf.MODEL_ARCH_NAMES[model_arch], _mapped(gguf, model_arch, config, names, light_filter)


def _mapped(gguf: Any, model_arch: Any, config: dict[str, Any], names: list[str],
            keep: Callable[[str], str | None]) -> dict[str, str | None]:
    text = config.get("text_config") or config
    n_blocks = next(text[k] for k in ("n_layers", "num_hidden_layers", "n_layer", "num_layers") if k in text)
    tmap = gguf.get_tensor_name_map(model_arch, n_blocks)
    out: dict[str, str | None] = {}
    for name in names:
        kept = keep(name)
        out[name] = None if kept is None else moe_scale(kept) or tmap.get_name(key=kept,
                                                                                try_suffixes=(".weight", ".bias"))
    return out


if __name__ == "__main__":
    main()
    sys.stdout.flush()
    os._exit(0)  # the map is written: skip the teardown of the converter's torch (≈ 0.5 s) edgekit waits on
