"""A recipe's engine sections, checked by their engines as the recipe is loaded.

``runtime.<section>:`` holds one engine's own settings (llama.cpp's ``llama_cpp``, vLLM's ``vllm`` …); the
engine that declares the section validates it with its own model, so config/ knows no engine's settings. The
served engine's section is completed with its defaults, so a release.json records every setting it ran with.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import ValidationError

from edgekit.config.engine_table import engine_names
from edgekit.config.recipes import Recipe
from edgekit.config.recipes import load_recipe as load_recipe_file
from edgekit.config.yamlfile import first_problem, where_in
from edgekit.engines import get_engine
from edgekit.errors import EdgekitError

if TYPE_CHECKING:
    from edgekit.engines.capabilities import EngineBase


def sections() -> dict[str, EngineBase]:
    """Section name → the engine it belongs to, over every registered engine (each imported for it)."""
    out: dict[str, EngineBase] = {}
    for name in engine_names():
        engine = get_engine(name)
        if engine.settings_section is not None:
            out[engine.settings_section] = engine
    return out


def _refusal(recipe: Recipe, loc: tuple[str | int, ...], msg: str) -> EdgekitError:
    """The sentence config's loader would give: the file, the line, the field."""
    where = where_in(Path(recipe.source_file), ("runtime", *loc)) if recipe.source_file else f"recipe {recipe.name}"
    return EdgekitError(f"{where}: field 'runtime.{'.'.join(map(str, loc))}': {msg}.")


def _refuse_stray(recipe: Recipe, key: str, owners: dict[str, EngineBase]) -> EdgekitError:
    served = recipe.runtime.engine  # the served engine's own setting of that name first
    for section, engine in sorted(owners.items(), key=lambda kv: kv[1].name != served):
        if engine.Settings is not None and key in engine.Settings.model_fields:
            return _refusal(recipe, (key,), f"a setting of engine {engine.name}, which goes in its section: "
                                            f"runtime.{section}.{key}")
    return _refusal(recipe, (key,), "unknown field (an engine's own settings go in its section: "
                                    f"{', '.join(f'runtime.{s}' for s in owners)})")


def check_recipe(recipe: Recipe) -> Recipe:
    """The recipe with each engine section validated by its engine and the served engine's completed."""
    extra = dict(recipe.runtime.model_extra or {})
    served = get_engine(recipe.runtime.engine)
    owners = sections() if any(k != served.settings_section for k in extra) else (
        {served.settings_section: served} if served.settings_section else {})
    checked = {}
    for key, value in extra.items():
        engine = owners.get(key)
        if engine is None or not isinstance(value, dict):
            raise _refuse_stray(recipe, key, owners) if engine is None else _refusal(
                recipe, (key,), f"engine {engine.name}'s section, a mapping of its settings")
        checked[key] = _validated(recipe, engine, key, value)
    if served.settings_section is not None and served.settings_section not in checked:
        checked[served.settings_section] = _validated(recipe, served, served.settings_section, {})
    if recipe.runtime.spec_type not in served.spec_types:
        raise _refusal(recipe, ("spec_type",), f"engine {served.name} serves {', '.join(served.spec_types)}, not "
                                               f"{recipe.runtime.spec_type!r}")
    return recipe.model_copy(update={"runtime": recipe.runtime.model_copy(update=checked)})


def _validated(recipe: Recipe, engine: EngineBase, key: str, value: dict) -> dict:
    assert engine.Settings is not None
    try:
        return engine.Settings.model_validate(value).model_dump(mode="json")
    except ValidationError as exc:
        loc, msg = first_problem(exc)
        raise _refusal(recipe, (key, *loc), msg) from None


def load_recipe(name_or_path: str) -> Recipe:
    """A recipe by name or path (edgekit.config.recipes.load_recipe), its engine sections checked."""
    return check_recipe(load_recipe_file(name_or_path))
