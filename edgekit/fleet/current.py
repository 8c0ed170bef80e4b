"""Before the playbook: which boards already serve their planned release and answer /health.

When every board does, a re-run needs no Ansible at all (its start alone costs more than the whole
check): each board is asked in one pass, in parallel, over the connections the run already holds,
and reported with the health its last activation recorded, as `edgekit deploy` does. The release state
read on the way is handed to the playbook (the boards stay locked until it ends), which reads none
itself: a board whose state cannot be read here is reported with the reason and left out of the run.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from edgekit.deploy import health as health_mod
from edgekit.deploy.activate import board_state
from edgekit.errors import EdgekitError
from edgekit.fleet.connect import Fleet
from edgekit.fleet.plan import BoardPlan, FleetPlan
from edgekit.fleet.report import board_report


@dataclass
class Found:
    state: dict[str, Any]  # the fields of the agent's `state` that the roles read, and "serves"
    report: dict[str, Any] | None  # set when the board needs nothing


def _current(fleet: Fleet, bp: BoardPlan) -> Found:
    target = fleet.targets[bp.name]
    sudo = target.facts.sudo_prefix
    lay, active = board_state(target.runner, bp.base, sudo)
    rid = bp.plan.release_id
    serves = lay.current == rid and lay.serving == rid and active  # the planned release, as its service
    found = Found({"current": lay.current, "serving": lay.serving, "releases": lay.releases,
                   "has_release": rid in lay.releases, "active": active, "serves": serves,
                   "sudo": sudo}, None)
    if not serves or lay.health is None:
        return found
    m = bp.plan.typed
    try:
        health = health_mod.quick(target.runner, m.port, lay.health, m.drafter)
    except Exception:  # any doubt sends the board through the playbook, which checks it properly
        health = None
    if health is None:
        return found
    found.report = board_report(rid, lay.current, False, health.to_dict(), bp.strategy,
                                {"skipped_blobs": len(bp.plan.blobs)})
    return found


def already_current(fleet: Fleet, fp: FleetPlan) -> tuple[dict[str, Found], dict[str, str]]:
    """(board name → its state, and its report when it needs nothing; board name → why its state is unknown)."""
    plans = [fp.boards[n] for n in fleet.targets if n in fp.boards]
    if not plans:
        return {}, {}
    with ThreadPoolExecutor(max_workers=min(16, len(plans)), thread_name_prefix="current") as pool:
        outcome = dict(zip((bp.name for bp in plans), pool.map(lambda bp: _safe(fleet, bp), plans), strict=True))
    found = {n: r for n, r in outcome.items() if isinstance(r, Found)}
    return found, {n: r for n, r in outcome.items() if isinstance(r, str)}


def _safe(fleet: Fleet, bp: BoardPlan) -> Found | str:
    try:
        return _current(fleet, bp)
    except EdgekitError as exc:
        return f"its release state could not be read: {exc.message}"
    except Exception as exc:  # one board's surprise is that board's failure, not the run's
        return f"its release state could not be read: {type(exc).__name__}: {exc}"
