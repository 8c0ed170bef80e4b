"""Compatibility fixes for the pinned transformers, applied only where they are needed."""

from __future__ import annotations

_applied = False


def patch_transformers() -> None:
    """Let transformers 5.23 build Gemma 4 assistant drafters, and their larger targets feed them.

    In 5.23.0, ``Gemma4TextConfig.kv_sharing_modes`` raises for a config whose layers all reuse
    the target's KV cache, which is every ``Gemma4AssistantForCausalLM``. 5.24.0 returns
    ``["reuse"] * n`` for that case; this backports exactly that branch. And a target with no
    KV-shared layers (the 12B, 26B-A4B, 31B) stores no layer's K and V for its assistant: the last
    layer of each type stores them here (what "store" does: keep them in ``shared_kv_states``; the
    target's own output is unchanged). The same for the 12B's ``Gemma4UnifiedTextConfig``.
    """
    global _applied
    if _applied:
        return
    from transformers.models.gemma4 import configuration_gemma4 as cfg
    from transformers.models.gemma4_unified import configuration_gemma4_unified as unified

    for config_class in (cfg.Gemma4TextConfig, unified.Gemma4UnifiedTextConfig):  # the 12B's assistant: the same
        _all_reuse(config_class)
    _applied = True


def _all_reuse(config_class: type) -> None:
    prop = getattr(config_class, "kv_sharing_modes", None)
    if not (isinstance(prop, property) and prop.fget is not None):
        return
    original = prop.fget

    def kv_sharing_modes(self):  # type: ignore[no-untyped-def]
        if self.num_hidden_layers and self.num_kv_shared_layers == self.num_hidden_layers:
            return ["reuse"] * self.num_hidden_layers
        if self.num_hidden_layers and not self.num_kv_shared_layers and self.layer_types:
            # A target without KV sharing (12B, 26B-A4B, 31B) stores nothing in 5.23, so its assistant has no
            # cache to read: store the last layer of each type, the ones llama.cpp's assistant reads (n-2, n-1).
            modes: list[str | None] = [None] * self.num_hidden_layers
            for kind in set(self.layer_types):
                modes[max(i for i, t in enumerate(self.layer_types) if t == kind)] = "store"
            return modes
        return original(self)

    config_class.kv_sharing_modes = property(kv_sharing_modes)
