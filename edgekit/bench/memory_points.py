"""Which of a bench's context lengths the board's memory (and the model) holds, decided per point before any
server starts.

The bench servers get ``plan.parallel`` slots of ``plan.slot_ctx`` tokens, sized for the longest context, so a
32 k point on a small board could ask for more KV cache than it has. Each context length's need is the release's
models, its KV cache at that length (release.json's ``kv_layout``: full layers hold slots × (length + n_gen +
margin) tokens, sliding layers each slot's window)
and the runtime around them (edgekit.release.memory, as deploy counts it), against what the kernel says is
available — plus, when the bench stops the deployed service first, what that service holds. A length past the
model's trained context (release.json's ``model_context``) is left out too: llama-server gives no slot more. A
length that does not fit is left out with the numbers; none fitting is refused in one sentence.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from edgekit.bench.plan import PROMPT_MARGIN, Plan
from edgekit.bench.workloads import Point
from edgekit.errors import EdgekitError
from edgekit.models.footprint import KvBytes
from edgekit.release.memory import MemoryNeed, kv_of_manifest, models_mb


@dataclass(frozen=True)
class Served:
    """What a release on the board holds in memory, from its release.json."""

    weights_mb: float
    kv: KvBytes | None
    ctx_size: int
    parallel: int

    @classmethod
    def of(cls, manifest: dict[str, Any]) -> Served:
        sizes = {rel: int((e or {}).get("size") or 0) for rel, e in (manifest.get("files") or {}).items()}
        runtime = manifest.get("runtime") or {}
        return cls(models_mb(sizes), kv_of_manifest(manifest), int(runtime.get("ctx_size") or 0),
                   int(runtime.get("parallel") or 1))

    def need(self, tokens: int, parallel: int) -> MemoryNeed:
        return MemoryNeed(self.weights_mb, (self.kv.at(tokens, parallel) if self.kv else 0) / 1e6)


def _within_model_context(plan: Plan, measured: Sequence[dict[str, Any]], say: Callable[[str], None]) -> Plan:
    """Without the context lengths past the model's trained context (llama-server caps a slot there)."""
    limits = [int(m["model_context"]) for m in measured if m.get("model_context")]
    if not limits:
        return plan
    limit = min(limits)
    over = sorted({p.context_length for p in plan.points if (p.context_length or 0) + plan.n_gen > limit})
    if not over:
        return plan
    note = f"context lengths {over} left out: the model was trained for {limit} tokens"
    say(note)
    points = [p for p in plan.points if p.context_length not in over]
    if not points:
        raise EdgekitError(f"No context length of this bench fits the model: {note}.")
    return _keep(plan, points, [*plan.notes, note])


def fit(plan: Plan, measured: Sequence[dict[str, Any]], deployed: dict[str, Any] | None, available_mb: int | None,
        say: Callable[[str], None]) -> Plan:
    """``plan`` without the context lengths whose bench server would not fit (``measured``: the releases the bench
    serves; ``deployed``: the service it stops first, or None when it leaves it running)."""
    plan = _within_model_context(plan, measured, say)
    if plan.parallel is None or available_mb is None:
        return plan  # the deployed slots (they fit, they serve), or a board that does not say
    releases = [Served.of(m) for m in measured]
    if any(r.kv is None for r in releases):
        return replace(plan, notes=[*plan.notes, "memory per context length not checked: the release does not "
                                    "record its KV cache per token (redeploy it with this edgekit)"])
    freed = 0.0
    if deployed is not None:
        d = Served.of(deployed)
        held = d.need(d.ctx_size, d.parallel)
        freed = held.weights_mb + held.kv_mb
    room = available_mb + freed
    ctxs = sorted({p.context_length or 0 for p in plan.points})
    fits, notes = [], list(plan.notes)
    for ctx in ctxs:
        tokens = plan.parallel * (ctx + plan.n_gen + PROMPT_MARGIN)
        need = max((r.need(tokens, plan.parallel) for r in releases), key=lambda n: n.total_mb)
        if need.total_mb <= room:
            fits.append(ctx)
            continue
        note = (f"context length {ctx} left out: {plan.parallel} slot(s) of {ctx + plan.n_gen + PROMPT_MARGIN} "
                f"tokens need {need.describe()}, the board has {room:.0f} MB"
                + (f" (MemAvailable {available_mb} MB + {freed:.0f} MB the stopped service frees)" if freed else ""))
        notes.append(note)
        say(note)
    if not fits:
        raise EdgekitError(f"No context length of this bench fits the board's memory: {notes[-1]}. Use fewer "
                           "--slots, shorter --context-lengths, or a smaller KV cache type.")
    return _keep(plan, [p for p in plan.points if (p.context_length or 0) in fits], notes)


def _keep(plan: Plan, points: list[Point], notes: list[str]) -> Plan:
    """``plan`` with only ``points``, its servers sized for the longest of them."""
    longest = max(p.context_length or 0 for p in points)
    return replace(plan, points=points, notes=notes, slot_ctx=longest + plan.n_gen + PROMPT_MARGIN)
