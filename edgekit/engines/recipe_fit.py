"""Whether a recipe fits a board's memory, known before anything is downloaded, built or sent.

A recipe whose models are published Gemma 4 checkpoints (``google/gemma-4-…``, QAT or not) has the structure of a
config edgekit ships (edgekit.models.gemma4_configs): its weights at the recipe's quantization, the target's KV
cache at a context (at the engine's cache types, as its server allocates it: edgekit.models.footprint), the
compute buffers its server reserves at that context on the board's kind (EngineBase.compute_bytes_of) and the
runtime around them (edgekit.release.memory, as deploy's check after the build counts them) follow from it. Text
only: a vision or audio projector is served only where the memory holds it beside the model (convert.mmproj).
A model known only once it is downloaded or made (a local path, a synthetic model) is sized after its conversion,
by the check every deploy makes before it sends a byte.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from edgekit.config.recipes import ModelSource, Recipe
from edgekit.engines.capabilities import EngineBase
from edgekit.errors import EdgekitError
from edgekit.models.footprint import BYTES_PER_WEIGHT, Footprint, KvBytes, footprint, sum_layouts
from edgekit.models.gemma4_configs import config_name_of_repo, published_config
from edgekit.release.memory import MemoryNeed

# The context lengths a fit table tries, up to the model's own.
CONTEXTS = (2048, 4096, 8192, 16384, 32768, 65536, 131072, 262144)


@dataclass(frozen=True)
class Part:
    role: str  # target, drafter
    config: str  # the shipped config it has the structure of
    quant: str
    model: Footprint

    @property
    def weights_mb(self) -> float:
        return self.model.weight_bytes(self.quant) / 1e6


@dataclass(frozen=True)
class RecipeSize:
    recipe: str
    parts: tuple[Part, ...]
    kv: KvBytes
    context: int  # the target's trained context
    compute: Callable[[int], int]  # context → the server's compute buffers in bytes

    @property
    def weights_mb(self) -> float:
        return sum(p.weights_mb for p in self.parts)

    def need(self, ctx: int, parallel: int) -> MemoryNeed:
        return MemoryNeed(self.weights_mb, self.kv.at(ctx, parallel) / 1e6, self.compute(ctx) / 1e6)

    def active_bytes(self) -> int:
        """What the target reads per decoded token (its top-k experts of an MoE; the roofline's numerator)."""
        return self.parts[0].model.active_bytes(self.parts[0].quant)

    def largest_context(self, mem_mb: float, parallel: int) -> int | None:
        """The longest of CONTEXTS (within the model's) whose need fits ``mem_mb``; None: not even the shortest."""
        fits = [c for c in CONTEXTS if c <= self.context and self.need(c, parallel).total_mb <= mem_mb]
        return max(fits) if fits else None


def _part(role: str, source: ModelSource, quant: str) -> Part | None:
    name = config_name_of_repo(source.repo) if source.repo else None
    if name is None or quant not in BYTES_PER_WEIGHT:
        return None
    return Part(role, name, quant, footprint(published_config(name)))


def recipe_size(recipe: Recipe, engine: EngineBase, profile: str | None = None) -> RecipeSize | None:
    """The recipe's size from its models' published structure, served on a board of ``profile`` (None: with the
    recipe's settings as written); None where a model's is not known before it is downloaded (or the engine cannot
    say what cache its server allocates)."""
    sources = [("target", recipe.target), *([("drafter", recipe.drafter)] if recipe.drafter else [])]
    parts = [_part(role, source, engine.served_quant(source.quant, recipe.runtime)) for role, source in sources]
    if any(p is None for p in parts):
        return None
    known = [p for p in parts if p is not None]
    kv = engine.kv_bytes_of(sum_layouts([p.model.kv() for p in known]), recipe.runtime)
    if kv is None:
        return None
    shapes = [(p.model.heads, p.model.vocab) for p in known]
    return RecipeSize(recipe.name, tuple(known), kv, known[0].model.context or max(CONTEXTS),
                      lambda ctx: engine.compute_bytes_of(shapes, recipe.runtime, profile, ctx))


def check_before_build(recipe: Recipe, engine: EngineBase, name: str, profile: str | None, mem_available_mb: int,
                       frees_mb: Callable[[], float], say: Callable[[str], None]) -> None:
    """Refuse, in one sentence with the numbers, a recipe the board (of ``profile``) cannot hold at runtime.ctx_size
    even once the release it serves stops (``frees_mb``: that release's models, read from the board only when it
    matters): before a model is downloaded or converted."""
    size = recipe_size(recipe, engine, profile)
    if size is None:
        return
    rt = recipe.runtime
    need = size.need(rt.ctx_size, rt.parallel)
    room = float(mem_available_mb)
    if need.total_mb > room:
        room += frees_mb()
    if need.total_mb <= room:
        say(f"memory: {need.describe()} at {rt.ctx_size} tokens of context, the board has {room:.0f} MB")
        return
    longest = size.largest_context(room, rt.parallel)
    advice = (f"it would fit at runtime.ctx_size {longest}" if longest else
              "its weights alone do not fit: choose a smaller model or a board with more memory")
    models = ", ".join(f"{p.config} at {p.quant} {p.weights_mb:.0f} MB" for p in size.parts)
    raise EdgekitError(
        f"Board {name!r} has {room:.0f} MB of memory available but recipe {recipe.name!r} needs {need.describe()} "
        f"at {rt.ctx_size} tokens of context ({models}); nothing was downloaded, built or sent and what the board "
        f"serves is unchanged; {advice}.")


def fit_row(recipe: Recipe, engine: EngineBase, mem_mb: float, profile: str | None = None) -> dict[str, Any]:
    """One row of ``edgekit recipes fit``: the recipe's size and the longest context ``mem_mb`` holds on a board of
    ``profile``."""
    size = recipe_size(recipe, engine, profile)
    row: dict[str, Any] = {"recipe": recipe.name, "engine": engine.name, "memory_mb": round(mem_mb)}
    if size is None:
        return {**row, "known": False, "fits": None,
                "why": "its models' structure is known only once they are downloaded or made (deploy checks then)"}
    parallel = recipe.runtime.parallel
    longest = size.largest_context(mem_mb, parallel)
    at = size.need(recipe.runtime.ctx_size, parallel)
    return {**row, "known": True, "models": [{"role": p.role, "structure": p.config, "quant": p.quant,
                                              "weights_mb": round(p.weights_mb)} for p in size.parts],
            "weights_mb": round(size.weights_mb), "kv_layout": size.kv.to_dict(), "parallel": parallel,
            "ctx_size": recipe.runtime.ctx_size, "need_at_ctx_size_mb": round(at.total_mb),
            "compute_at_ctx_size_mb": round(at.compute_mb),
            "fits": at.total_mb <= mem_mb, "longest_context": longest, "model_context": size.context,
            "need_at_longest_mb": round(size.need(longest, parallel).total_mb) if longest else None,
            "active_bytes_per_token": size.active_bytes()}

