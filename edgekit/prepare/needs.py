"""What a recipe's models need installed on this workstation, checked before anything is fetched, built,
generated or sent: one sentence and the command that brings it (edgekit.optional).

- a Hugging Face repo: huggingface-hub (edgekit's own dependency);
- GGUF conversion (llama.cpp's converter imports torch and reads the tokenizer with transformers), generated
  tiny models, drafter alignment, the comparison with transformers: the ``convert`` extra;
- a LiteRT-LM bundle: litert-torch and litert-lm-api in the LiteRT Python (edgekit.convert.litert);
- a model that a package ships as a GGUF, where llama.cpp serves it: that package.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING

from edgekit import optional

if TYPE_CHECKING:
    from edgekit.config.recipes import ModelSource, Recipe


def _sources(recipe: Recipe) -> list[ModelSource]:
    return [s for s in (recipe.target, recipe.drafter) if s is not None]


def convert_reason(recipe: Recipe, formats: Collection[str] = ("gguf",), align: bool = False,
                   reference: bool = False) -> str | None:
    """Why the recipe needs the convert extra here (the purpose, as the sentence says it), or None."""
    made = [s for s in _sources(recipe) if s.package is None]  # a package ships its GGUF: nothing to make
    if not made:
        return None
    if reference:
        return f"checking recipe {recipe.name}'s GGUF against transformers"
    if "gguf" in formats:
        return f"converting recipe {recipe.name}'s models to GGUF"
    if align:
        return f"aligning recipe {recipe.name}'s drafter"
    if any(s.synthetic for s in made):
        return f"generating recipe {recipe.name}'s tiny models"
    if recipe.drafter is not None and recipe.drafter.align is not None and recipe.drafter.package is None:
        return f"aligning recipe {recipe.name}'s drafter"
    return None


def check(recipe: Recipe, formats: Collection[str] = ("gguf",), *, align: bool = False, reference: bool = False,
          serve: bool = False) -> None:
    """Refuse, in one sentence, a recipe whose ``formats`` (some of prepare.pipeline.FORMATS) this Python cannot
    make. ``align``: its drafter is re-fitted (`edgekit drafter align`); ``reference``: its target also runs in
    transformers (`edgekit verify`); ``serve``: llama.cpp serves it, so a package that ships a GGUF must be
    installed."""
    reason = convert_reason(recipe, formats, align, reference)
    wanted = [optional.extra(None, only={"huggingface-hub"})] if any(s.repo for s in _sources(recipe)) else []
    if reason is not None:
        wanted.append(optional.extra("convert"))
    if wanted:
        optional.require(reason or f"fetching recipe {recipe.name}'s models from Hugging Face", *wanted)
    packages = [s.package for s in _sources(recipe) if s.package is not None]
    if serve and "gguf" in formats and packages:
        optional.require(f"recipe {recipe.name}", *(optional.package(p) for p in packages))
    if "litertlm" in formats and recipe.target.package is None:
        from edgekit.convert.litert import check_python

        check_python(f"recipe {recipe.name}'s LiteRT-LM bundle")
