"""Known upstream bugs on Jetson boards, as data: which runtime settings trip them and what edgekit does.

Each guard names its upstream issue, the boards and llama.cpp refs it affects, a condition on the
recipe's runtime, and the change that avoids it. `deploy` (and the fleet plan, through the same
``compose``) applies every guard that matches, prints it and records it in the release's
``release.json``. A recipe overrides a guard only by naming it in ``runtime.llama_cpp.allow_quirks``; that is
recorded too.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pydantic import ValidationError

from edgekit.config.profiles import get_profile
from edgekit.config.recipes import Runtime
from edgekit.engines.llamacpp.settings import changed, of
from edgekit.errors import EdgekitError


@dataclass(frozen=True)
class Guard:
    id: str  # the upstream issue
    families: tuple[str, ...]  # board families it affects
    refs: tuple[str, ...] | None  # llama.cpp short commits it affects; None: every ref (no fix known yet)
    why: str
    applies: Callable[[Runtime, bool], bool]  # (runtime, has drafter) → does the bug bite?
    fix: Callable[[Runtime], Runtime]
    action: str


def _no_fa(rt: Runtime) -> Runtime:
    return changed(rt, flash_attn="off")


def _no_scale_queues(rt: Runtime) -> Runtime:
    return rt.model_copy(update={"env": {k: v for k, v in rt.env.items() if k != "CUDA_SCALE_LAUNCH_QUEUES"}})


GUARDS: tuple[Guard, ...] = (
    Guard(
        id="llama.cpp#24457", families=("orin",), refs=None,
        why="flash attention with --spec-type draft-mtp aborts in ggml-cuda fattn.cu on Orin (Gemma 4 E4B + MTP)",
        applies=lambda rt, drafter: drafter and rt.spec_type == "draft-mtp" and of(rt).flash_attn != "off"
        and (of(rt).n_gpu_layers > 0 or of(rt).n_gpu_layers_draft > 0),
        fix=_no_fa, action="--flash-attn off while drafting",
    ),
    Guard(
        id="llama.cpp#19219", families=("orin",), refs=None,
        why="CUDA_SCALE_LAUNCH_QUEUES=4x (set by jetson-containers) deadlocks decoding on single-GPU Orin",
        applies=lambda rt, _d: "CUDA_SCALE_LAUNCH_QUEUES" in rt.env,
        fix=_no_scale_queues, action="CUDA_SCALE_LAUNCH_QUEUES is not set in the unit",
    ),
)


@dataclass(frozen=True)
class Applied:
    id: str
    action: str
    why: str
    overridden: bool  # the recipe allowed the quirk: nothing was changed

    def to_dict(self) -> dict[str, object]:
        return {"id": self.id, "action": self.action, "why": self.why, "overridden": self.overridden}

    def line(self) -> str:
        if self.overridden:
            return f"guard {self.id} NOT applied (runtime.llama_cpp.allow_quirks): {self.why}"
        return f"guard {self.id}: {self.action} ({self.why})"


def apply_guards(runtime: Runtime, profile: str, llama_ref: str, has_drafter: bool) -> tuple[Runtime, list[Applied]]:
    """The runtime to serve with on a board of ``profile``, and every guard that matched."""
    family = get_profile(profile).family
    applied: list[Applied] = []
    for g in GUARDS:
        if family not in g.families or (g.refs is not None and llama_ref not in g.refs):
            continue
        if not g.applies(runtime, has_drafter):
            continue
        overridden = g.id in of(runtime).allow_quirks
        applied.append(Applied(g.id, g.action, g.why, overridden))
        if not overridden:
            runtime = g.fix(runtime)
            _check_fixed(runtime, g)
    return runtime, applied


def _check_fixed(runtime: Runtime, guard: Guard) -> None:
    """A guard's fix may take what another setting needs (flash attention off: a quantized V cache needs it)."""
    try:
        of(runtime)
    except ValidationError as exc:
        raise EdgekitError(f"Guard {guard.id} ({guard.action}: {guard.why}) conflicts with runtime.llama_cpp: "
                           f"{exc.errors()[0]['msg'].removeprefix('Value error, ')}; change that setting (a quantized "
                           "K cache needs no flash attention), or name the guard in allow_quirks.") from None
