"""The end of a fleet run as data: which boards succeeded, which failed (and why), which were untouched.

Built from the `edgekit_report` callback's JSON plus the boards edgekit itself could not
connect to, probe or lock before the playbook (those never reach Ansible).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from edgekit.fleet.commands import activation

PUSH_COUNTS = ("sent_blobs", "sent_bytes", "skipped_blobs", "missing_blobs", "missing_bytes", "rechecked_bytes",
               "corrupt_blobs")


@dataclass
class FleetSummary:
    operation: str  # rollout | rollback
    boards: list[str]
    check: bool = False
    succeeded: dict[str, dict[str, Any]] = field(default_factory=dict)
    failed: dict[str, dict[str, Any]] = field(default_factory=dict)
    untouched: list[str] = field(default_factory=list)
    stopped: bool = False  # a canary failure or max_fail_percentage ended the run early
    seconds: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def changed(self) -> list[str]:
        return [n for n, r in self.succeeded.items() if r.get("changed")]

    @property
    def ok(self) -> bool:
        return not self.failed

    def to_dict(self) -> dict[str, Any]:
        return {
            "operation": self.operation, "check": self.check, "boards": self.boards,
            "succeeded": self.succeeded, "failed": self.failed, "untouched": self.untouched,
            "changed": self.changed, "stopped": self.stopped, "seconds": self.seconds, **self.extra,
        }

    def headline(self) -> str:
        mode = " (check mode: nothing was changed)" if self.check else ""
        return (f"{self.operation}: {len(self.succeeded)} succeeded ({len(self.changed)} changed), "
                f"{len(self.failed)} failed, {len(self.untouched)} untouched{mode}")


def board_report(release: str, previous: str | None, changed: bool, health: dict[str, Any] | None,
                 strategy: str, push: dict[str, Any]) -> dict[str, Any]:
    """One board's row of a rollout's report, whoever decided it (edgekit before the playbook, or after it)."""
    return {"release": release, "previous": previous, "changed": changed, "health": health, "strategy": strategy,
            "push": {k: int(push.get(k) or 0) for k in PUSH_COUNTS}}


def activation_report(plan: dict[str, Any], registered: dict[str, Any], check: bool) -> dict[str, Any] | None:
    """What a rollout did to a board that came through it: from its plan (with the state edgekit read) and
    the results the playbook registered (edgekit_release_push, edgekit_service_out).
    None when the board did not get through (the play stopped before its activation ended)."""
    state = plan["state"]
    done = registered.get("edgekit_service_out") or {}
    outcome = activation(str(done.get("stdout") or ""))
    current, main = outcome["current"], outcome["main"]
    needed = current is None or not current.get("ok")
    # Done: started and checked (a failure reports itself), or found healthy, or --check after the push's check.
    if main is None and needed and not (check and "edgekit_release_push" in registered):
        return None
    row = board_report(plan["release"], state.get("current"), needed and not check,
                       main if main is not None else current,
                       plan["strategy"] if state.get("active") else "in-place",
                       registered.get("edgekit_release_push") or {})
    return {**row, "would_create_release": not state.get("has_release"), "would_activate": needed}


def _reason(host: dict[str, Any]) -> str:
    data = (host.get("data") or {}).get("edgekit") or {}
    if data.get("reason"):
        return str(data["reason"])
    if host.get("unreachable"):
        return f"unreachable: {host['unreachable']}"
    failures = host.get("failures") or []
    if failures:
        last = failures[-1]
        return f"{last['msg']} (task: {last['task']})"
    return "the playbook ended before this board finished"


def summarize(operation: str, boards: list[str], report: dict[str, Any], preflight: dict[str, str],
              check: bool = False, phases: dict[str, str] | None = None) -> FleetSummary:
    """``preflight``: boards that failed before the playbook (name → reason), in ``phases`` (else "connect")."""
    summary = FleetSummary(operation, boards, check=check, stopped=bool(report.get("stopped")))
    hosts: dict[str, Any] = report.get("hosts") or {}
    for name in boards:
        if name in preflight:
            summary.failed[name] = {"reason": preflight[name], "phase": (phases or {}).get(name, "connect")}
            continue
        host = hosts.get(name)
        if host is None or not host.get("touched"):
            summary.untouched.append(name)
            continue
        stats = host.get("stats") or {}
        data = (host.get("data") or {}).get("edgekit") or {}
        if host.get("unreachable") or stats.get("failures") or stats.get("unreachable") or data.get("failed"):
            summary.failed[name] = {"reason": _reason(host), "phase": "playbook",
                                    **{k: data[k] for k in ("release", "previous", "logs") if data.get(k)}}
        elif data:
            summary.succeeded[name] = data
        else:
            summary.failed[name] = {"reason": _reason(host), "phase": "playbook"}
    if any(f.get("phase") == "playbook" for f in summary.failed.values()) and summary.untouched:
        summary.stopped = True
    return summary
