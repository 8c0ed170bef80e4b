"""The fleet's release plans, computed once on the workstation and handed to the playbook.

The recipe's engine makes every board's release (its class's ``fleet_releases``: llama.cpp builds once
per build target and converts the models once per recipe, then `edgekit deploy`'s own `compose()` makes
the release for each distinct (build, base directory, service port), so boards that share those share one
release id and one plan; another engine makes each board's release as deploy does). The result is the
playbook's extra vars: the blobs (local paths), each board's release (files, ports, drafter, strategy)
and what the plays need of edgekit: its agent, unit names and health settings.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rich.console import Console

from edgekit.config.recipes import Recipe
from edgekit.config.serve_address import is_loopback
from edgekit.deploy.pipeline import DeployOptions, choose_strategy
from edgekit.fleet.connect import Target
from edgekit.release.health import HEALTH_PROMPT
from edgekit.release.plan import ReleasePlan
from edgekit.release.units import CANDIDATE_UNIT, LEGACY_CANDIDATE_UNITS, LEGACY_UNITS, UNIT_NAME, WATCHDOG_UNIT
from edgekit.remote import agent_ship

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
            "key_file": m.api_key_file or "",  # a path on the board; the key itself is placed before the playbook
            "draft_counters": ",".join(m.draft_counters),
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
    """What every playbook needs: edgekit's agent, unit names, health-check settings (each engine's dialect by
    name: the roles know a release's engine from its release.json, and Ansible's workers import no engine)."""
    from edgekit.engines import ENGINES, get_engine

    return {
        # edgekit's agent (a zipapp named by its hash): the action sends it where a board lacks it
        "agent": {"name": agent_ship.app().name, "src": str(agent_ship.local_file()), "dir": agent_ship.DIR,
                  "python": agent_ship.PYTHON},
        "units": {"main": UNIT_NAME, "candidate": CANDIDATE_UNIT, "watchdog": WATCHDOG_UNIT,
                  "legacy": list(LEGACY_UNITS), "stale": list(LEGACY_CANDIDATE_UNITS)},
        "health": {"timeout": health_timeout, "n_predict": HEALTH_N_PREDICT, "prompt": HEALTH_PROMPT,
                   "apis": {name: get_engine(name).health_api for name in ENGINES},
                   # each engine's draft counters (a release made before it recorded its own)
                   "counters": {name: ",".join(get_engine(name).draft_counters or ()) for name in ENGINES}},
    }


def plan_fleet(recipe: Recipe, targets: dict[str, Target], options: DeployOptions, console: Console) -> FleetPlan:
    """Each board's release, as the recipe's engine makes them for a fleet (``fleet_releases``: llama.cpp
    builds once per distinct board kind and converts once); one BoardPlan per target."""
    from edgekit.engines import get_engine

    engine = get_engine(recipe.runtime.engine)
    engine.check_exposure(recipe.runtime.host, is_loopback(recipe.runtime.host))
    made = engine.fleet_releases(recipe, targets, options.src, options.cuda, console)
    result = FleetPlan(recipe.name, builds=dict(made.builds))
    for name, t in targets.items():
        plan = made.plans[name]
        result.boards[name] = BoardPlan(name, t.facts.base, plan, choose_strategy(options, t.facts, plan),
                                        options.keep or recipe.keep_releases)
    return result


def rollout_vars(fp: FleetPlan, health_timeout: float) -> dict[str, Any]:
    fleet = fleet_vars(health_timeout)
    fleet["blobs"] = fp.blobs()
    fleet["recipe"] = fp.recipe
    return {"edgekit_fleet": fleet, "edgekit_plans": {n: bp.to_vars() for n, bp in fp.boards.items()}}
