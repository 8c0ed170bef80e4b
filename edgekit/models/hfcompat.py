"""Compatibility fixes for the pinned transformers, applied only where they are needed."""

from __future__ import annotations

_applied = False


def patch_transformers() -> None:
    """Let transformers 5.23 build Gemma 4 assistant drafters.

    In 5.23.0, ``Gemma4TextConfig.kv_sharing_modes`` raises for a config whose layers all reuse
    the target's KV cache, which is every ``Gemma4AssistantForCausalLM``. 5.24.0 returns
    ``["reuse"] * n`` for that case; this backports exactly that branch and changes nothing else.
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
        return original(self)

    config_class.kv_sharing_modes = property(kv_sharing_modes)
