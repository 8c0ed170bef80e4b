"""Make a pushed release the one the board serves, without ever leaving the board serving nothing.

Strategy "candidate" (default when memory allows): start the new release as a second unit on a
spare port, health-check it there while the old release keeps serving, then restart the main
unit on the new release, check it again, and only then switch `current`. Strategy "in-place" (for
boards that cannot hold two models): restart the main unit on the new release, health-check it,
and on failure put the old release back; a board that serves nothing yet starts the new release in
place (there is nothing for a candidate to protect). Either way a failure leaves `current` and the service on
the last good release, and the error carries the server's last log lines.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Literal

from edgekit.deploy import health as health_mod
from edgekit.deploy.service import Service, log_tail
from edgekit.errors import EdgekitError
from edgekit.release.health import Health
from edgekit.release.manifest import ReleaseManifest, ServeSpec
from edgekit.release.plan import ReleasePlan, service_ports
from edgekit.release.units import CANDIDATE_UNIT, UNIT_NAME
from edgekit.remote import releases
from edgekit.remote.runner import LocalRunner, SshRunner

Runner = SshRunner | LocalRunner
Strategy = Literal["candidate", "in-place"]


class HealthCheckFailed(EdgekitError):
    def __init__(self, message: str, logs: str) -> None:
        super().__init__(message)
        self.logs = logs


@dataclass
class Activation:
    release_id: str
    changed: bool
    previous: str | None
    health: Health
    strategy: str
    pruned: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, object]:
        return {"release": self.release_id, "changed": self.changed, "previous": self.previous,
                "strategy": self.strategy, "health": self.health.to_dict(), "pruned": self.pruned}


@dataclass
class BoardPaths:
    base: str  # absolute

    def release(self, rid: str) -> str:
        return f"{self.base}/releases/{rid}"

    def unit_file(self, rid: str, unit: str = UNIT_NAME) -> str:
        return f"{self.release(rid)}/{unit}"

    @property
    def log(self) -> str:
        return f"{self.base}/logs/llama-server.log"

    def candidate_log(self) -> str:
        return f"{self.base}/logs/llama-server-candidate.log"


def board_state(runner: Runner, base: str, need_sudo: bool) -> tuple[releases.Layout, bool]:
    """The board's releases and whether its service runs.

    Two round trips that do not depend on each other, on two channels of the one connection at once: on
    a redeploy (or a fleet re-run) that changes nothing they are most of what the board is asked.
    """
    with ThreadPoolExecutor(max_workers=1) as pool:
        active = pool.submit(Service(runner, UNIT_NAME, need_sudo).is_active)
        return releases.layout(runner, base), active.result()


@dataclass(frozen=True)
class ActivationSpec:
    """One release to activate on a board: its files, how its server is checked, and the policy around it."""

    release_id: str
    file_shas: dict[str, str]
    serve: ServeSpec  # the main port's check; the candidate is checked the same way on candidate_port
    candidate_port: int
    keep: int
    strategy: Strategy = "candidate"
    timeout: float = 180.0

    @classmethod
    def of_plan(cls, plan: ReleasePlan, keep: int, strategy: Strategy = "candidate",
                timeout: float = 180.0) -> ActivationSpec:
        m = plan.typed
        candidate = m.candidate_port if m.candidate_port is not None else service_ports(None, m.port)[1]
        return cls(plan.release_id, plan.file_shas(), m.serve, candidate, keep, strategy, timeout)


def activate(runner: Runner, base: str, spec: ActivationSpec, need_sudo: bool,
             on_step: Callable[[str], None] = lambda _msg: None) -> Activation:
    release_id, port, strategy, expect_drafts = spec.release_id, spec.serve.port, spec.strategy, spec.serve.drafter
    paths = BoardPaths(base)
    main = Service(runner, UNIT_NAME, need_sudo)
    lay, serves = board_state(runner, base, need_sudo)
    previous = lay.current

    def check(svc: Service, p: int) -> Health:
        log = paths.candidate_log() if svc.unit == CANDIDATE_UNIT else paths.log
        return health_mod.check(runner, spec.serve.on_port(p), timeout=spec.timeout, unit=svc.unit, log_file=log)

    if lay.current == release_id and lay.serving == release_id and serves:
        recorded = health_mod.quick(runner, port, lay.health, expect_drafts) if lay.health else None
        if recorded is not None:
            on_step("release already current and /health answers")
            return Activation(release_id, False, previous, recorded, strategy)
        on_step("release already current: checking health")
        h = check(main, port)
        if h.ok:
            releases.record_health(runner, base, release_id, h.to_dict())
            return Activation(release_id, False, previous, h, strategy)
    on_step(f"creating release {release_id}")
    releases.create(runner, base, release_id, spec.file_shas)

    if strategy == "candidate" and not serves:
        # A candidate protects what serves; with nothing serving, the service's own start is the check.
        on_step("nothing serves yet: starting the release as the service itself")
        strategy = "in-place"
    if strategy == "candidate":
        cand = Service(runner, CANDIDATE_UNIT, need_sudo)
        on_step(f"starting the new release as a candidate on port {spec.candidate_port}")
        cand.install(paths.unit_file(release_id, CANDIDATE_UNIT))
        cand.restart()
        h = check(cand, spec.candidate_port)
        cand.remove()
        if not h.ok:
            logs = log_tail(runner, paths.candidate_log())
            raise HealthCheckFailed(
                f"Release {release_id} failed its health check on board {runner.name!r} ({h.reason}); "
                f"the board still serves {previous or 'nothing new'}.", logs)

    on_step("restarting the service on the new release")
    main.install(paths.unit_file(release_id))
    main.restart()
    h = check(main, port)
    if not h.ok:
        logs = log_tail(runner, paths.log)
        _restore(runner, main, paths, previous, on_step)
        raise HealthCheckFailed(
            f"Release {release_id} failed its health check on board {runner.name!r} ({h.reason}); "
            f"rolled back to {previous or 'no release (service stopped)'}.", logs)
    releases.record_health(runner, base, release_id, h.to_dict())
    releases.switch(runner, base, release_id)
    releases.mark_serving(runner, base, release_id)
    pruned = releases.prune(runner, base, spec.keep, protect={release_id, previous or ""})
    return Activation(release_id, True, previous, h, strategy, pruned)


def _restore(runner: Runner, main: Service, paths: BoardPaths, previous: str | None,
             on_step: Callable[[str], None]) -> None:
    if previous is None:
        main.stop()
        return
    on_step(f"rolling back to {previous}")
    main.install(paths.unit_file(previous))
    main.restart()
    releases.switch(runner, paths.base, previous)
    releases.mark_serving(runner, paths.base, previous)


def rollback(runner: Runner, base: str, need_sudo: bool, to: str | None = None,
             timeout: float = 180.0) -> Activation:
    """Switch back to the release before `current` (or ``to``), restart and check it."""
    lay = releases.layout(runner, base)
    target = to or lay.previous()
    if target is None:
        raise EdgekitError(f"Board {runner.name!r} has no earlier release to roll back to.")
    if target not in lay.releases:
        raise EdgekitError(f"Board {runner.name!r} has no release {target!r}.")
    manifest = ReleaseManifest.read(releases.read_manifest(runner, base, target),
                                    f"release {target} on board {runner.name!r}")
    paths = BoardPaths(base)
    main = Service(runner, UNIT_NAME, need_sudo)
    main.install(paths.unit_file(target))
    main.restart()
    h = health_mod.check_release(runner, manifest, paths.log, timeout=timeout, unit=main.unit)
    if not h.ok:
        logs = log_tail(runner, paths.log)
        _restore(runner, main, paths, lay.current, lambda _m: None)
        raise HealthCheckFailed(f"Release {target} is not healthy on board {runner.name!r} ({h.reason}); "
                                f"kept {lay.current}.", logs)
    releases.switch(runner, base, target)
    releases.mark_serving(runner, base, target)
    return Activation(target, True, lay.current, h, "rollback")
