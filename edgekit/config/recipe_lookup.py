"""Where a recipe comes from: an explicit path, then ./recipes/, then the user's config dir, then the
recipes built into edgekit. A recipe found earlier shadows one of the same name found later, and says so."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from edgekit.config.names import check_name
from edgekit.errors import EdgekitError
from edgekit.paths import config_dir
from edgekit.resources import builtin_recipes_dir

# origin → what `recipes list` calls it
ORIGINS = {
    "file": "the file named",
    "env": "$EDGEKIT_RECIPES",
    "cwd": "./recipes",
    "user": "the user's config dir",
    "builtin": "built-in",
}


@dataclass(frozen=True)
class FoundRecipe:
    name: str
    path: Path
    origin: str  # a key of ORIGINS
    shadows: tuple[Path, ...] = field(default=())  # recipes of the same name further down the search

    @property
    def shadows_builtin(self) -> bool:
        return any(p.parent == builtin_recipes_dir() for p in self.shadows)

    def describe(self) -> str:
        """'./recipes (shadows the built-in one)' — for `recipes list` / `show` and deploy's notes."""
        where = ORIGINS[self.origin]
        if self.shadows_builtin:
            return f"{where} (shadows the built-in {self.name})"
        if self.shadows:
            return f"{where} (shadows {self.shadows[0]})"
        return where


def recipe_dirs() -> list[tuple[str, Path]]:
    """The search path, first match wins: $EDGEKIT_RECIPES (colon-separated; for scripts and tests),
    ./recipes, <config dir>/recipes (~/.config/edgekit/recipes), then the built-ins."""
    dirs = [("env", Path(p).expanduser()) for p in os.environ.get("EDGEKIT_RECIPES", "").split(os.pathsep) if p]
    dirs += [("cwd", Path("recipes")), ("user", config_dir() / "recipes"), ("builtin", builtin_recipes_dir())]
    return dirs


def _matches(name: str) -> list[tuple[str, Path]]:
    return [(origin, d / f"{name}.yaml") for origin, d in recipe_dirs() if (d / f"{name}.yaml").is_file()]


def find_recipe(name_or_path: str) -> FoundRecipe:
    """A recipe by path (anything with a '/' or a .yaml/.yml suffix) or by name along the search path."""
    if name_or_path.endswith((".yaml", ".yml")) or "/" in name_or_path:
        candidate = Path(name_or_path).expanduser()
        if not candidate.is_file():
            raise EdgekitError(f"The recipe file {candidate} does not exist.")
        return FoundRecipe(candidate.stem, candidate, "file")
    try:
        check_name(name_or_path, "recipe name")
    except ValueError as exc:
        raise EdgekitError(str(exc)[0].upper() + str(exc)[1:] + ".") from None
    found = _matches(name_or_path)
    if not found:
        known = ", ".join(r.name for r in list_recipes()) or "none"
        raise EdgekitError(f"No recipe named {name_or_path!r} (known recipes: {known}).")
    (origin, path), rest = found[0], found[1:]
    return FoundRecipe(name_or_path, path, origin, tuple(p for _, p in rest))


def list_recipes() -> list[FoundRecipe]:
    """Every recipe name on the search path, each as the file that wins."""
    names = sorted({p.stem for _, d in recipe_dirs() if d.is_dir() for p in d.glob("*.yaml")})
    return [find_recipe(n) for n in names if _valid_name(n)]


def _valid_name(name: str) -> bool:
    try:
        check_name(name, "recipe name")
    except ValueError:
        return False
    return True
