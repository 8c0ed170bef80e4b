"""Before a byte is sent: does the board have the memory the release needs? Its models, its KV cache at the
recipe's context and the runtime (edgekit.release.memory) against what the board's kernel says is available
(MemAvailable: on a Jetson the GPU takes from the same memory), not its total."""

from __future__ import annotations

from collections.abc import Callable

from edgekit.config.recipes import Recipe
from edgekit.engines import recipe_fit
from edgekit.engines.capabilities import EngineBase
from edgekit.errors import EdgekitError
from edgekit.release.manifest import ReleaseManifest
from edgekit.release.memory import models_mb, need_of
from edgekit.release.plan import ReleasePlan
from edgekit.remote import releases
from edgekit.remote.probe import BoardFacts
from edgekit.remote.runner import Runner


def check(runner: Runner, name: str, facts: BoardFacts, plan: ReleasePlan, kv_bytes: int, in_place: bool,
          compute_bytes: int = 0) -> None:
    """Refuse, in one sentence with the numbers, a release the board's memory cannot hold. In place, the server
    it replaces stops first: its models' memory counts as free. A release the board serves already passes."""
    available = facts.mem_available_mb
    need = need_of(plan, kv_bytes, compute_bytes)
    if available is None or need.total_mb <= available:
        return
    lay = releases.layout(runner, facts.base)
    if lay.current == plan.release_id:
        return  # it runs already: the memory it needs is what it holds
    frees = serving_models_mb(runner, name, facts.base, lay.current) if in_place else 0.0
    if need.total_mb <= available + frees:
        return
    freed = f" (+{frees:.0f} MB its current release frees as it stops)" if frees else ""
    raise EdgekitError(
        f"Board {name!r} has {available} MB of memory available{freed} but release {plan.release_id} needs "
        f"{need.describe()}; nothing was sent and what the board serves is unchanged. Free memory on the board, "
        "or lower runtime.ctx_size (or runtime.parallel), or choose a smaller model.")


def serving_models_mb(runner: Runner, name: str, base: str, current: str | None) -> float:
    """The models of the release the board serves: memory its server frees as it stops (0 without one)."""
    if not current:
        return 0.0
    manifest = ReleaseManifest.read(releases.read_manifest(runner, base, current),
                                    f"release {current} on board {name!r}")
    return models_mb({rel: entry.size for rel, entry in manifest.files.items()})


def check_recipe(runner: Runner, name: str, facts: BoardFacts, profile: str, recipe: Recipe, engine: EngineBase,
                 say: Callable[[str], None]) -> None:
    """Before a model is downloaded or built: a recipe of published models the board cannot hold at its context
    even once the release it serves stops is refused in one sentence (edgekit.engines.recipe_fit)."""
    if facts.mem_available_mb is None:
        return
    recipe_fit.check_before_build(recipe, engine, name, profile, facts.mem_available_mb,
                                  lambda: serving_models_mb(runner, name, facts.base, facts.current), say)
