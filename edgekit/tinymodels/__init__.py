"""Every model edgekit generates for tests, the sim and benchmarks: one home, one registry.

- :mod:`~edgekit.tinymodels.published`: the published E2B/E4B structure (towers, double-wide MLP, ordered
  embeddings) and the 31B's (K = V full layers with KV heads of their own, no per-layer inputs, no KV sharing;
  its assistant's dense head), only small: what users deploy;
- :mod:`~edgekit.tinymodels.legacy`: edgekit's first text-only pair (kept where a test needs exactly it);
- :mod:`~edgekit.tinymodels.tuned`: a target briefly fine-tuned on text, so a drafter has something to follow;
- :mod:`~edgekit.tinymodels.tokenizer` and :mod:`~edgekit.tinymodels.grid`: their tokenizers and QAT grid.

Everything is deterministic in ``seed``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from importlib import resources
from pathlib import Path

from edgekit.config.synthetic import PUBLISHED_VARIANTS, SYNTHETIC_MODELS

Maker = Callable[[Path, int], Path]


def _legacy(role: str, qat: bool) -> Maker:
    def make(out_dir: Path, seed: int) -> Path:
        from edgekit.tinymodels import legacy

        return (legacy.make_target if role == "target" else legacy.make_drafter)(out_dir, seed, qat)
    return make


def _published(variant: str, role: str, qat: bool) -> Maker:
    def make(out_dir: Path, seed: int) -> Path:
        from edgekit.tinymodels import published

        return (published.make_target if role == "target" else published.make_assistant)(out_dir, variant, seed, qat)
    return make


def _tuned(base: Maker) -> Maker:
    def make(out_dir: Path, seed: int) -> Path:
        from edgekit.tinymodels.tuned import make_tuned_target  # trains with torch: imported on demand

        return make_tuned_target(out_dir, seed, base)
    return make


SYNTHETIC_MAKERS: dict[str, Maker] = {
    "tiny-gemma4": _legacy("target", False),
    "tiny-gemma4-qat": _legacy("target", True),
    "tiny-gemma4-assistant": _legacy("drafter", False),
    "tiny-gemma4-assistant-qat": _legacy("drafter", True),
    "tiny-gemma4-tuned": _tuned(_legacy("target", False)),
}
for _variant in PUBLISHED_VARIANTS:
    SYNTHETIC_MAKERS.update({
        f"tiny-gemma4-{_variant}": _published(_variant, "target", False),
        f"tiny-gemma4-{_variant}-qat": _published(_variant, "target", True),
        f"tiny-gemma4-{_variant}-tuned": _tuned(_published(_variant, "target", False)),
        f"tiny-gemma4-{_variant}-assistant": _published(_variant, "assistant", False),
        f"tiny-gemma4-{_variant}-assistant-qat": _published(_variant, "assistant", True),
    })
if set(SYNTHETIC_MAKERS) != set(SYNTHETIC_MODELS):  # the recipe schema's list and the generators must agree
    raise RuntimeError(f"edgekit.config.synthetic and the generators differ: "
                       f"{sorted(set(SYNTHETIC_MAKERS) ^ set(SYNTHETIC_MODELS))}")


def fingerprint() -> str:
    """Changes whenever any generator would write different bytes (for store keys and cache paths)."""
    digest = hashlib.sha256()
    for path in sorted(Path(__file__).parent.glob("*.py")):
        digest.update(path.name.encode() + path.read_bytes())
    data = resources.files("edgekit").joinpath("data")
    configs = sorted(f"gemma4-configs/{f.name}" for f in data.joinpath("gemma4-configs").iterdir()
                     if f.name.endswith(".config.json"))
    for name in ("align_prompts.txt", *configs):
        digest.update(name.encode() + data.joinpath(name).read_bytes())
    return digest.hexdigest()[:16]


__all__ = ["SYNTHETIC_MAKERS", "fingerprint"]
