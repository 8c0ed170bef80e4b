"""Before the playbook: which boards already serve their planned release and answer /health.

When every board does, a re-run needs no Ansible at all (its start alone costs more than the whole
check): each board is asked in one pass, in parallel, over the connections the run already holds,
and reported with the health its last activation recorded, as `edgekit deploy` does.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

from edgekit.deploy import health as health_mod
from edgekit.deploy.activate import board_state
from edgekit.fleet.connect import Fleet
from edgekit.fleet.plan import BoardPlan, FleetPlan


def _current(fleet: Fleet, bp: BoardPlan) -> dict[str, Any] | None:
    target = fleet.targets[bp.name]
    lay, active = board_state(target.runner, bp.base, target.facts.sudo != "root")
    rid = bp.plan.release_id
    if lay.current != rid or lay.serving != rid or lay.health is None or not active:
        return None
    m = bp.plan.manifest
    health = health_mod.quick(target.runner, int(m["port"]), lay.health, bool(m["drafter"]))
    if health is None:
        return None
    # The shape of the playbook's own report for a board it left alone.
    return {"release": rid, "previous": lay.current, "changed": False, "health": health.to_dict(),
            "strategy": bp.strategy, "push": {"sent_blobs": 0, "sent_bytes": 0, "skipped_blobs": len(bp.plan.blobs),
                                              "missing_blobs": 0, "missing_bytes": 0}}


def already_current(fleet: Fleet, fp: FleetPlan) -> dict[str, dict[str, Any]]:
    """Board name → its report, for the boards that need nothing; a board that fails the check is left out."""
    plans = [fp.boards[n] for n in fleet.targets if n in fp.boards]
    if not plans:
        return {}
    with ThreadPoolExecutor(max_workers=min(16, len(plans)), thread_name_prefix="current") as pool:
        found = dict(zip((bp.name for bp in plans), pool.map(lambda bp: _safe(fleet, bp), plans), strict=True))
    return {n: r for n, r in found.items() if r is not None}


def _safe(fleet: Fleet, bp: BoardPlan) -> dict[str, Any] | None:
    try:
        return _current(fleet, bp)
    except Exception:  # any doubt sends the board through the playbook, which reports it properly
        return None
