"""The names of the models edgekit generates (edgekit.tinymodels makes them), which a recipe may name as
`synthetic:`. Kept in config, below the generators, so the recipe schema imports nothing that trains."""

from __future__ import annotations

LEGACY_MODELS = ("tiny-gemma4", "tiny-gemma4-qat", "tiny-gemma4-assistant", "tiny-gemma4-assistant-qat",
                 "tiny-gemma4-tuned")
PUBLISHED_VARIANTS = ("e2b", "e4b", "31b", "26b-a4b", "12b")  # edgekit.tinymodels.published.VARIANTS
PUBLISHED_MODELS = tuple(f"tiny-gemma4-{variant}{kind}" for variant in PUBLISHED_VARIANTS
                         for kind in ("", "-qat", "-tuned", "-assistant", "-assistant-qat"))
SYNTHETIC_MODELS = LEGACY_MODELS + PUBLISHED_MODELS
