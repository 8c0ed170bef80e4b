"""The fleet's release plans, computed once on the workstation and handed to the playbook.

llama.cpp is built once per build target (the boards' profile, or "host" for simulated boards),
the models are converted once per recipe, and `edgekit deploy`'s own `compose()` makes the
release for each distinct (build, base directory, service port): boards that share those share
one release id and one plan. The result is the playbook's extra vars: the blobs (local paths),
each board's release (files, ports, drafter, strategy) and edgekit's board-side scripts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from edgekit.config.recipes import Recipe
from edgekit.deploy.pipeline import DeployOptions, choose_strategy
from edgekit.engines.llamacpp import check_glibc, choose_build, compose, llama_src, server_help
from edgekit.fleet.connect import Target
from edgekit.fleet.scripts import scripts
from edgekit.release.health import HEALTH_PROMPT
from edgekit.release.plan import ReleasePlan
from edgekit.release.units import CANDIDATE_UNIT, UNIT_NAME

HEALTH_N_PREDICT = 24  # edgekit.deploy.health.check's default


@dataclass
class BoardPlan:
    name: str
    base: str  # absolute, as probed
    plan: ReleasePlan
    strategy: str
    keep: int

    def to_vars(self) -> dict[str, Any]:
        m = self.plan.typed
        files: list[str] = []
        for rel, sha in sorted(self.plan.file_shas().items()):  # releases.create's order
            files += [rel, sha]
        return {
            "release": self.plan.release_id, "base": self.base, "port": m.port,
            "candidate_port": m.candidate_port, "drafter": m.drafter, "strategy": self.strategy,
            "keep": self.keep, "files": files, "blobs": [b.sha256 for b in self.plan.blobs],
            "engine": m.engine, "model": m.recipe, "gpu": m.gpu, "chat": m.chat, "media": ",".join(m.media),
        }


@dataclass
class FleetPlan:
    recipe: str
    boards: dict[str, BoardPlan] = field(default_factory=dict)
    builds: dict[str, str] = field(default_factory=dict)  # build target → artifact key

    def releases(self) -> dict[str, str]:
        return {n: bp.plan.release_id for n, bp in self.boards.items()}

    def blobs(self) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        for bp in self.boards.values():
            for blob in bp.plan.files.values():
                prev = out.get(blob.sha256)
                out[blob.sha256] = {"sha256": blob.sha256, "src": str(blob.path), "size": blob.size,
                                    "executable": blob.executable or bool(prev and prev["executable"])}
        return out

    def payload_bytes(self) -> int:
        return sum(b["size"] for b in self.blobs().values())


def fleet_vars(health_timeout: float) -> dict[str, Any]:
    """What every playbook needs: edgekit's board-side scripts, unit names, health-check settings."""
    return {
        "scripts": scripts(),
        "units": {"main": UNIT_NAME, "candidate": CANDIDATE_UNIT},
        "health": {"timeout": health_timeout, "n_predict": HEALTH_N_PREDICT, "prompt": HEALTH_PROMPT},
    }


def plan_fleet(recipe: Recipe, targets: dict[str, Target], options: DeployOptions, console: Console) -> FleetPlan:
    """Build, convert and compose once per distinct board kind; one BoardPlan per target."""
    from edgekit.build import BuildOptions, build
    from edgekit.engines.llamacpp_models import resolve_models

    if recipe.runtime.engine != "llama.cpp":
        return plan_engine_fleet(recipe, targets, options, console)
    src = llama_src(options.src)
    result = FleetPlan(recipe.name)
    built: dict[str, tuple[Path, str, str]] = {}  # build target → (bin dir, key, --help)
    manifests: dict[str, dict[str, Any]] = {}
    composed: dict[tuple[str, str, int | None], ReleasePlan] = {}
    models: dict[str, Path] | None = None
    for name, t in targets.items():
        # One build per board kind and JetPack line: an Orin on JetPack 6 and one on 7.2 get different builds,
        # an emulated Orin (no GPU driver) the CPU build of its profile.
        choice = choose_build(t.board, t.facts, options.cuda)
        target = choice.target
        kind_key = target if target == "host" else f"{target}@{'cpu' if choice.cpu_only else t.facts.cuda}"
        if kind_key not in built:
            console.print(f"[dim]fleet: build llama.cpp for {kind_key}[/dim]")
            art = build(BuildOptions(target=target, cpu_only=choice.cpu_only, src=src, board_cuda=t.facts.cuda,
                                     board_jetpack=t.facts.jetpack), console=console, runner=t.runner)
            built[kind_key] = (art.bin_dir, art.artifact.key, server_help(art))
            result.builds[kind_key] = art.artifact.key
            manifests[kind_key] = art.artifact.manifest
        check_glibc(manifests[kind_key], t.facts)
        if models is None:
            console.print("[dim]fleet: models[/dim]")
            models = resolve_models(recipe, console, src)
        bin_dir, key, help_text = built[kind_key]
        kind = (kind_key, t.facts.base, t.board.service_port)
        if kind not in composed:
            composed[kind] = compose(recipe, t.board, t.facts.base, bin_dir, key, help_text, models, target,
                                     choice.gpu)
        plan = composed[kind]
        result.boards[name] = BoardPlan(name, t.facts.base, plan, choose_strategy(options, t.facts, plan),
                                        options.keep or recipe.keep_releases)
    return result


def plan_engine_fleet(recipe: Recipe, targets: dict[str, Target], options: DeployOptions,
                      console: Console) -> FleetPlan:
    """Any other engine: its own release per board (models made once, then from the store), as deploy makes it;
    the engine checks each board for its runtime first, before anything is sent."""
    from edgekit.engines import ReleaseContext, get_engine

    engine = get_engine(recipe.runtime.engine)
    result = FleetPlan(recipe.name)
    for name, t in targets.items():
        made = engine.release(ReleaseContext(name, t.board, t.facts, recipe, t.runner, console,
                                             lambda m, n=name: console.print(f"[dim]fleet: {n}: {m}[/dim]"),
                                             options.src, options.cuda))
        result.boards[name] = BoardPlan(name, t.facts.base, made.plan, choose_strategy(options, t.facts, made.plan),
                                        options.keep or recipe.keep_releases)
    return result


def rollout_vars(fp: FleetPlan, health_timeout: float) -> dict[str, Any]:
    fleet = fleet_vars(health_timeout)
    fleet["blobs"] = fp.blobs()
    fleet["recipe"] = fp.recipe
    return {"edgekit_fleet": fleet, "edgekit_plans": {n: bp.to_vars() for n, bp in fp.boards.items()}}
