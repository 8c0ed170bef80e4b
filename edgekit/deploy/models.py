"""The GGUF files a release serves: converted from the recipe's models, or shipped by a package."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from edgekit.config.recipes import Recipe
from edgekit.deploy.packaged import packaged_gguf
from edgekit.errors import EdgekitError


def resolve_models(recipe: Recipe, console: Console, src: str | None = None) -> dict[str, Path]:
    """{"models/target.gguf": path, "models/drafter.gguf": path} — converted only when inputs changed."""
    from edgekit.convert.pipeline import convert_recipe

    out: dict[str, Path] = {}
    for role, source in (("target", recipe.target), ("drafter", recipe.drafter)):
        if source is not None and source.package is not None:
            art = packaged_gguf(source.package)
            out[f"models/{role}.gguf"] = art.file(art.manifest["model_file"])
    if len(out) < (2 if recipe.drafter else 1):
        if not recipe.convert.gguf:
            raise EdgekitError(f"Recipe {recipe.name} turns GGUF conversion off, but llama-server needs GGUF files.")
        result = convert_recipe(recipe, src=src, say=lambda m: console.print(f"[dim]convert: {m}[/dim]"))
        for conv in result.models:
            out[f"models/{conv.role}.gguf"] = conv.file
    return out
