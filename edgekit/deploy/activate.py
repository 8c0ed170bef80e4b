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

import json
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Literal

from edgekit.agent import health as board_health
from edgekit.agent.activate import DRAFT_COUNTERS_ENV
from edgekit.agent.units import UNITS_FILE
from edgekit.deploy import health as health_mod
from edgekit.deploy.service import Service, log_tail
from edgekit.errors import EdgekitError
from edgekit.release.health import Health
from edgekit.release.manifest import ReleaseManifest, ServeSpec
from edgekit.release.plan import ReleasePlan, service_ports
from edgekit.release.units import (
    CANDIDATE_UNIT,
    LEGACY_CANDIDATE_UNITS,
    LEGACY_UNITS,
    UNIT_NAME,
    WATCHDOG_UNIT,
    activation_program,
    service_log,
)
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
        return service_log(self.base)

    def candidate_log(self) -> str:
        return service_log(self.base, candidate=True)


def board_state(runner: Runner, base: str, sudo: Sequence[str]) -> tuple[releases.Layout, bool]:
    """The board's releases and whether its service runs.

    Two round trips that do not depend on each other, on two channels of the one connection at once: on
    a redeploy (or a fleet re-run) that changes nothing they are most of what the board is asked.
    """
    with ThreadPoolExecutor(max_workers=1) as pool:
        active = pool.submit(service_active, runner, sudo)
        return releases.layout(runner, base), active.result()


def service_active(runner: Runner, sudo: Sequence[str]) -> bool:
    return active_unit(runner, sudo) is not None


def active_unit(runner: Runner, sudo: Sequence[str]) -> str | None:
    """The name the board's service runs under: this edgekit's, or one an older edgekit gave it (LEGACY_UNITS)."""
    return next((unit for unit in (UNIT_NAME, *LEGACY_UNITS) if Service(runner, unit, sudo).is_active()), None)


def counters_env(serve: ServeSpec) -> list[str]:
    """``env EDGEKIT_DRAFT_COUNTERS=…`` before a board's program, for a release whose release.json predates its
    engine naming its draft counters (the program reads the release's own first)."""
    names = health_mod.draft_counters(serve)
    return ["env", f"{DRAFT_COUNTERS_ENV}={','.join(names)}"] if names else []


def unit_options() -> list[str]:
    """The watchdog's unit; the service's older names, for the board's program to stop and remove as it starts the
    service, and an older edgekit's candidate, removed before one starts."""
    return ["--watchdog-unit", WATCHDOG_UNIT, *(arg for unit in LEGACY_UNITS for arg in ("--legacy-unit", unit)),
            *(arg for unit in LEGACY_CANDIDATE_UNITS for arg in ("--stale-unit", unit))]


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


def check_options(serve: ServeSpec, timeout: float) -> list[str]:
    """The health check's options for the activation program (it adds --port, --unit and --log per step)."""
    return board_health.check_options(**health_mod.check_settings(serve, timeout))


def _steps(stdout: str) -> dict[str, object]:
    """What the program printed: each step's Health, the steps begun, and its result."""
    out: dict[str, object] = {"begun": []}
    for line in stdout.splitlines():
        step, _, rest = line.strip().partition(" ")
        if step == "begin":
            out["begun"].append(rest)  # type: ignore[union-attr]
        elif step in ("current", "candidate", "main", "result") and rest.startswith("{"):
            out[step] = json.loads(rest)
    return out


def _run_program(runner: Runner, argv: list[str], timeout: float, on_step: Callable[[str], None]) -> dict:
    res = runner.run(argv, check=False, timeout=timeout)
    steps = _steps(res.stdout)
    for begun in steps["begun"]:  # type: ignore[union-attr]
        on_step("starting the new release as a candidate" if begun == "candidate" else "restarting the service")
    if "result" not in steps:
        tail = (res.stderr.strip() or res.stdout.strip()).splitlines()[-1:] or [f"exit {res.exit_code}"]
        raise EdgekitError(f"The activation program failed on board {runner.name!r}: {tail[0]}")
    return steps


def activate(runner: Runner, base: str, spec: ActivationSpec, sudo: Sequence[str],
             on_step: Callable[[str], None] = lambda _msg: None) -> Activation:
    """The board's own activation program (agent/activate.py, carried by the release) does the switch; the host
    makes the release directory it runs from and answers a redeploy that changes nothing from the record."""
    release_id, port = spec.release_id, spec.serve.port
    paths = BoardPaths(base)
    lay, serves = board_state(runner, base, sudo)
    if lay.current == release_id and lay.serving == release_id and serves and lay.health:
        recorded = health_mod.quick(runner, port, lay.health, spec.serve.drafter)
        if recorded is not None:
            on_step("release already current and /health answers")
            return Activation(release_id, False, lay.current, recorded, spec.strategy)
    on_step(f"creating release {release_id}")
    releases.create(runner, base, release_id, spec.file_shas)
    argv = [*counters_env(spec.serve), *activation_program(base, release_id), "activate", "--base", base,
            "--release", release_id,
            "--port", str(port), "--unit", UNIT_NAME, "--log", paths.log, "--candidate-unit", CANDIDATE_UNIT,
            "--candidate-log", paths.candidate_log(), "--candidate-port", str(spec.candidate_port),
            "--strategy", spec.strategy, "--keep", str(spec.keep), "--check-first", *unit_options(),
            *check_options(spec.serve, spec.timeout)]
    # An SSH session's stdin stays open while this edgekit lives: if it is killed before the service restarts,
    # the board's program abandons the activation (a local board's stdin is this process's own).
    argv += ["--host-holds-stdin"] if isinstance(runner, SshRunner) else []
    steps = _run_program(runner, argv, spec.timeout * 3 + 120, on_step)
    result: dict = steps["result"]  # type: ignore[assignment]
    previous = result.get("previous")
    if result.get("ok"):
        h = steps.get("main") or steps.get("current")
        return Activation(release_id, bool(result["changed"]), previous, Health.of_dict(h),  # type: ignore[arg-type]
                          str(result["strategy"]), list(result.get("pruned") or []))
    cand, main = steps.get("candidate"), steps.get("main")
    if result.get("error"):  # the board refused a step (a full disk, a unit systemd would not take)
        raise HealthCheckFailed(
            f"Activating release {release_id} on board {runner.name!r} failed: {result['error']}; the board serves "
            f"{result.get('restored') or previous or 'nothing (service stopped)'}.", log_tail(runner, paths.log))
    if main is None and cand is not None:
        raise HealthCheckFailed(
            f"Release {release_id} failed its health check on board {runner.name!r} ({cand['reason']}); "  # type: ignore[index]
            f"the board still serves {previous or 'nothing new'}.", log_tail(runner, paths.candidate_log()))
    reason = (main or steps.get("current") or {}).get("reason", "no check")  # type: ignore[union-attr]
    raise HealthCheckFailed(
        f"Release {release_id} failed its health check on board {runner.name!r} ({reason}); "
        f"rolled back to {previous or 'no release (service stopped)'}.", log_tail(runner, paths.log))


def rollback(runner: Runner, base: str, sudo: Sequence[str], to: str | None = None,
             timeout: float = 180.0) -> Activation:
    """Switch back to the release before `current` (or ``to``), restart and check it (the board's program)."""
    lay = releases.layout(runner, base)
    target = to or lay.previous()
    if target is None:
        raise EdgekitError(f"Board {runner.name!r} has no earlier release to roll back to.")
    if target not in lay.releases:
        raise EdgekitError(f"Board {runner.name!r} has no release {target!r}.")
    manifest = ReleaseManifest.read(releases.read_manifest(runner, base, target),
                                    f"release {target} on board {runner.name!r}")
    if not runner.run(["test", "-f", f"{base}/releases/{target}/{UNITS_FILE}"], check=False, timeout=30).ok:
        raise EdgekitError(f"Release {target} on board {runner.name!r} was made by an earlier edgekit and carries "
                           "unit text, which edgekit no longer installs (a unit is rendered on the board from a spec); "
                           f"redeploy it (edgekit deploy --board {runner.name} --recipe {manifest.recipe}) instead of "
                           "rolling back to it.")
    # The program of the release serving now (this edgekit's, once it deployed here), else the target's own.
    prog = next((activation_program(base, rid) for rid in (lay.current, target) if rid and runner.run(
        ["test", "-f", f"{base}/releases/{rid}/agent/activate.py"], check=False, timeout=30).ok), None)
    if prog is None:
        raise EdgekitError(f"Board {runner.name!r}: neither release {lay.current} nor {target} carries edgekit's "
                           "activation program (both predate it); deploy once with this edgekit, then roll back.")
    paths = BoardPaths(base)
    argv = [*counters_env(manifest.serve), *prog, "rollback", "--base", base, "--release", target,
            "--port", str(manifest.port),
            "--unit", UNIT_NAME, "--log", paths.log, *unit_options(), *check_options(manifest.serve, timeout)]
    steps = _run_program(runner, argv, timeout * 2 + 120, lambda _m: None)
    h = Health.of_dict(steps.get("main") or {"ok": False, "reason": "no check"})  # type: ignore[arg-type]
    if not steps["result"].get("ok"):  # type: ignore[union-attr]
        raise HealthCheckFailed(f"Release {target} is not healthy on board {runner.name!r} ({h.reason}); "
                                f"kept {lay.current}.", log_tail(runner, paths.log))
    return Activation(target, True, lay.current, h, "rollback")
