"""What a bench will run: points, repetitions, slots — from the recipe's `bench:` and the options."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from edgekit.bench.workloads import Point, requests_per_run
from edgekit.config.recipes import Recipe
from edgekit.errors import EdgekitError

QUICK_IDLE_S = 2.0
IDLE_S = 5.0
PROMPT_MARGIN = 256  # room in a slot for a question longer than a short target context


@dataclass
class Overrides:
    """Command-line overrides of the recipe's bench settings (None: the recipe's)."""

    concurrency: list[int] | None = None
    context_lengths: list[int] | None = None
    temperatures: list[float] | None = None
    n_gen: int | None = None
    repetitions: int | None = None
    warmup: int | None = None
    cooldown_temp_c: float | str | None = "recipe"  # a number, None (off) or "recipe"
    slots: str = "auto"  # auto (= highest concurrency) | deployed | N
    idle_s: float | None = None
    rounds: int = 1  # requests per run: this many rounds over the categories


@dataclass
class Plan:
    points: list[Point]
    repetitions: int
    warmup: int
    n_gen: int
    idle_s: float
    cooldown_temp_c: float | None
    parallel: int | None  # slots the bench servers get (None: as deployed)
    slot_ctx: int
    llama_bench_pp: int
    llama_bench_reps: int
    rounds: int
    categories: int
    quick: bool
    notes: list[str] = field(default_factory=list)

    def requests(self, point: Point) -> int:
        return requests_per_run(point.concurrency, self.categories, self.rounds)

    def fits(self, cache_length: int) -> bool:
        """Every point's prompt plus n_gen fits one sequence of ``cache_length`` tokens (a LiteRT-LM bundle)."""
        return all((p.context_length or 0) + self.n_gen <= cache_length for p in self.points)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["points"] = [{"concurrency": p.concurrency, "context_length": p.context_length,
                           "temperature": p.temperature} for p in self.points]
        data["requests_per_run"] = {p.label(): self.requests(p) for p in self.points}
        return data


def _slots(value: str, concurrency: list[int]) -> int | None:
    if value == "auto":
        return max(concurrency)
    if value == "deployed":
        return None
    try:
        n = int(value)
    except ValueError:
        raise EdgekitError(f"--slots must be auto, deployed or a number, not {value!r}.") from None
    if n < 1:
        raise EdgekitError("--slots must be at least 1.")
    return n


def make_plan(recipe: Recipe, ov: Overrides, quick: bool, categories: int) -> Plan:
    b = recipe.bench
    conc = sorted(set(ov.concurrency or b.concurrency))
    ctxs = sorted(set(ov.context_lengths or b.context_lengths))
    temps = sorted(set(ov.temperatures or b.temperatures))
    reps = ov.repetitions or b.repetitions
    warmup = b.warmup if ov.warmup is None else ov.warmup
    n_gen = ov.n_gen or b.n_gen
    notes: list[str] = []
    if quick:
        conc = sorted({conc[0], conc[-1]}) if ov.concurrency is None else conc
        ctxs = ctxs[:1] if ov.context_lengths is None else ctxs
        temps = temps[:1] if ov.temperatures is None else temps
        reps = ov.repetitions or min(reps, 2)
        warmup = min(warmup, 1)
        n_gen = ov.n_gen or min(n_gen, 64)
        notes.append("quick: fewer points, at most 2 repetitions, n_gen ≤ 64")
    if reps < 2:
        notes.append("one repetition: no confidence intervals")
    cool = b.cooldown_temp_c if ov.cooldown_temp_c == "recipe" else ov.cooldown_temp_c
    parallel = _slots(ov.slots, conc)
    slot_ctx = max(ctxs) + n_gen + PROMPT_MARGIN
    if parallel is None:
        per_slot = recipe.runtime.ctx_size // recipe.runtime.parallel
        fits = [c for c in ctxs if c + n_gen <= per_slot]
        if len(fits) < len(ctxs):
            notes.append(f"context lengths {sorted(set(ctxs) - set(fits))} do not fit the deployed slots "
                         f"({per_slot} tokens): skipped")
        if not fits:
            raise EdgekitError(f"No context length fits the deployed server's slots ({per_slot} tokens); "
                               "use --slots auto or shorter --context-lengths.")
        ctxs = fits
        if max(conc) > recipe.runtime.parallel:
            notes.append(f"concurrency above the deployed {recipe.runtime.parallel} slot(s) queues requests")
    points = [Point(c, L, t) for t in temps for L in ctxs for c in conc]
    return Plan(points=points, repetitions=reps, warmup=warmup, n_gen=n_gen,
                idle_s=ov.idle_s if ov.idle_s is not None else (QUICK_IDLE_S if quick else IDLE_S),
                cooldown_temp_c=cool, parallel=parallel, slot_ctx=slot_ctx, llama_bench_pp=512,
                llama_bench_reps=1 if quick else min(reps, 5), rounds=ov.rounds, categories=categories,
                quick=quick, notes=notes)
