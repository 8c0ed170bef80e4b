"""Alignment as a recipe sees it: the recipe's target and drafter, its ``drafter.align`` settings, its K.

``aligned_drafter`` is what ``convert``'s input preparation calls for a drafter with an ``align``
block: the aligned drafter from the store (trained first if the store does not have it yet), as a
``ModelInput`` that converts and deploys like any other drafter.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from edgekit.align.run import AlignJob, align
from edgekit.config.align_spec import AlignSpec
from edgekit.config.recipes import Recipe
from edgekit.convert.inputs import ModelInput, resolve
from edgekit.errors import EdgekitError
from edgekit.store import Store


def recipe_spec(recipe: Recipe) -> AlignSpec:
    """The recipe's ``drafter.align`` block, or the defaults."""
    spec = getattr(recipe.drafter, "align", None) if recipe.drafter is not None else None
    return spec if isinstance(spec, AlignSpec) else AlignSpec.model_validate(spec or {})


def _check_sources(recipe: Recipe) -> None:
    if recipe.drafter is None:
        raise EdgekitError(f"Recipe {recipe.name} has no drafter to align (add a drafter and spec_type draft-mtp).")
    for role, source in (("target", recipe.target), ("drafter", recipe.drafter)):
        if source.package is not None:
            raise EdgekitError(f"Recipe {recipe.name}'s {role} comes from package {source.package}, which ships a "
                               "GGUF only; alignment needs the Hugging Face checkpoint (repo, path or synthetic).")


def recipe_job(recipe: Recipe, spec: AlignSpec, device: str = "cpu", threads: int | None = 1,
               assisted_prompts: int = 16) -> AlignJob:
    """Both models local (downloaded or generated as needed) and K resolved from the recipe's runtime."""
    _check_sources(recipe)
    assert recipe.drafter is not None
    target = resolve(recipe.target, "target", recipe.base_dir)
    drafter = resolve(recipe.drafter, "drafter", recipe.base_dir)
    return AlignJob(target, drafter, spec, spec.k or recipe.runtime.draft_n_max, device, threads, recipe.base_dir,
                    assisted_prompts)


def aligned_drafter(recipe: Recipe, target: ModelInput | None, drafter: ModelInput,
                    say: Callable[[str], None] = lambda _m: None, store: Store | None = None) -> ModelInput:
    """The recipe's drafter re-fitted to its target (store-cached), for conversion like any drafter."""
    _check_sources(recipe)
    if target is None:
        raise EdgekitError(f"Recipe {recipe.name}'s drafter has an align block but its target is not converted "
                           "by edgekit, so there is nothing to align it to.")
    spec = recipe_spec(recipe)
    job = AlignJob(target, drafter, spec, spec.k or recipe.runtime.draft_n_max, base_dir=recipe.base_dir)
    say(f"drafter: aligning to {target.label} ({spec.steps} steps; kept in the store afterwards)")
    outcome = align(job, store, say=say)
    m: dict[str, Any] = outcome.artifact.manifest
    say(f"drafter: aligned{' (cached)' if outcome.cached else ''}, held-out acceptance "
        f"{m['heldout']['before']['acceptance_rate']:.1%} → {m['heldout']['after']['acceptance_rate']:.1%}")
    return ModelInput("drafter", outcome.path, {"aligned": outcome.artifact.key, "fingerprint": m["fingerprint"],
                                                 "from": drafter.identity})


__all__ = ["aligned_drafter", "recipe_job", "recipe_spec"]
