"""The bench's own llama-server unit, and the board's service put back exactly as it was.

The bench never edits the deployed unit: it records whether `edgekit-serve.service` (or the service under
the name an older edgekit gave it) is active and enabled and the sha256 of its unit file, stops it when the
bench needs the board to itself, runs each configuration as `edgekit-bench.service` (rendered with
the same
release's server, on the candidate port), and at the end removes the bench unit and starts the deployed
unit again only if it was running before; the session compares the state before and after. The bench unit is
installed from a spec (release/units.py's unit_spec) by this edgekit's agent (its zipapp), as every unit is.
It is never restarted by systemd: a bench server that dies mid-run fails the bench with its log's last lines,
rather than serving the rest of the window from a fresh, cold process.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Sequence
from dataclasses import dataclass

from edgekit.bench import boardfs
from edgekit.deploy.health import wait_ready
from edgekit.deploy.service import log_tail
from edgekit.errors import EdgekitError
from edgekit.release.units import (
    LEGACY_UNITS,
    UNIT_NAME,
    unit_install_spec_argv,
    unit_remove_argv,
    unit_spec,
)
from edgekit.remote import agent_call, agent_ship
from edgekit.remote.runner import LocalRunner, SshRunner

Runner = SshRunner | LocalRunner
BENCH_UNIT = "edgekit-bench.service"


def _systemctl(runner: Runner, sudo: Sequence[str], *args: str, check: bool = False) -> bool:
    res = runner.run([*sudo, "systemctl", *args], check=False, timeout=90)
    if check and not res.ok:
        tail = (res.stderr or res.stdout).strip().splitlines()[-1:] or ["no output"]
        raise EdgekitError(f"`systemctl {' '.join(args)}` failed on board {runner.name!r}: {tail[0]}")
    return res.ok


def ended_how(result: str, status: str) -> str:
    """systemd's Result= and ExecMainStatus= of a unit that stopped, in words."""
    if result in ("signal", "core-dump") and status.isdigit():
        try:
            name = signal.Signals(int(status)).name
        except ValueError:
            name = f"signal {status}"
        return f"it was killed by {name}" + (" (core dumped)" if result == "core-dump" else "")
    if result == "exit-code" and status.isdigit():
        return f"it exited with status {status}"
    return f"it stopped (systemd: Result={result or 'unknown'})"


@dataclass(frozen=True)
class ServiceState:
    active: bool
    enabled: bool
    unit_sha256: str | None

    @classmethod
    def read(cls, runner: Runner, base: str, unit: str = UNIT_NAME) -> ServiceState:
        """The agent's `unit-state`: one round trip."""
        got = agent_call.call(runner, base, "unit-state", unit, timeout=30, doing=f"Reading {unit}'s state")
        return cls(active=bool(got.get("active")), enabled=bool(got.get("enabled")),
                   unit_sha256=got.get("unit_sha256") or None)

    def to_json(self) -> dict[str, object]:
        return {"active": self.active, "enabled": self.enabled, "unit_sha256": self.unit_sha256}


class Board:
    """Stop / restore the deployed service; start / stop the bench unit (never enabled)."""

    def __init__(self, runner: Runner, base: str, release_dir: str, sudo: Sequence[str], work: str,
                 main_port: int, user: str | None = None, hardening: str = "default") -> None:
        self.runner, self.base, self.release_dir, self.sudo = runner, base, release_dir, list(sudo)
        self.user = user  # the units' User= (the login user unless it is root)
        self.hardening = hardening  # the recipe's runtime.hardening
        self.work, self.main_port = work, main_port
        self.agent = agent_ship.command(agent_ship.ensure(runner, base))
        self.before: ServiceState | None = None
        self.unit = UNIT_NAME  # the deployed service's name on this board (remember() finds it)
        self.bench_installed = False

    @property
    def log(self) -> str:
        return f"{self.work}/llama-server-bench.log"

    def _priv(self, argv: list[str], check: bool = True) -> None:
        res = self.runner.run(argv, check=False, timeout=120)
        if check and not res.ok:
            tail = (res.stderr or res.stdout).strip().splitlines()[-1:] or ["no output"]
            raise EdgekitError(f"Starting the bench server failed on board {self.runner.name!r}: {tail[0]}")

    def _bench_active(self) -> bool:
        return _systemctl(self.runner, self.sudo, "is-active", "--quiet", BENCH_UNIT)

    def remember(self) -> ServiceState:
        self.before = ServiceState.read(self.runner, self.base)
        if not (self.before.active or self.before.unit_sha256):  # a board an older edgekit deployed last
            for name in LEGACY_UNITS:
                old = ServiceState.read(self.runner, self.base, name)
                if old.active or old.unit_sha256:
                    self.unit, self.before = name, old
                    break
        return self.before

    def stop_main(self) -> None:
        if self.before and self.before.active:
            _systemctl(self.runner, self.sudo, "stop", self.unit, check=True)

    def start_server(self, argv: list[str], port: int, description: str, timeout: float,
                     exe: list[str] | None = None, env: dict[str, str] | None = None,
                     release_dir: str | None = None, env_file: str = "", key_file: str = "") -> float:
        """(Re)start the bench unit with ``argv`` (relative to the release dir); seconds until ready.

        ``exe``: the server command (default: the release's llama-server), e.g. the LiteRT-LM front.
        ``release_dir``: the release it runs from (default: the deployed one), e.g. another engine's.
        """
        spec_file = f"{self.work}/{BENCH_UNIT}.json"
        rdir = release_dir or self.release_dir
        command = exe or [f"{rdir}/bin/llama-server"]
        spec = unit_spec(BENCH_UNIT, "bench", self.base, rdir.rsplit("/", 1)[-1], [*command, *argv], self.log,
                         self.user, env, env_file or None, key_file or None, restart="no",
                         hardening=self.hardening, writable=[rdir, self.work])
        boardfs.put_text(self.runner, spec_file, json.dumps(spec))
        self.bench_installed = True
        self._priv(unit_install_spec_argv(self.agent, spec_file))
        self._priv([*self.sudo, "systemctl", "restart", BENCH_UNIT])
        try:
            return wait_ready(self.runner, port, timeout, alive=self._bench_active)
        except TimeoutError as exc:
            logs = log_tail(self.runner, self.log, 15)
            raise EdgekitError(f"The bench server ({description}) did not start on board {self.runner.name!r}: "
                               f"{exc}. Last log lines:\n{logs}") from None

    def stopped(self, lines: int = 15) -> str | None:
        """How the bench server ended and its last log lines, when it is no longer running (it died under the
        load); None while it runs. systemd's own record says how: a signal (a crash) or an exit status."""
        if not self.bench_installed or self._bench_active():
            return None
        res = self.runner.run(["systemctl", "show", BENCH_UNIT, "-p", "Result", "-p", "ExecMainStatus"],
                              check=False, timeout=30)
        props = dict(ln.partition("=")[::2] for ln in res.stdout.splitlines() if "=" in ln)
        how = ended_how(props.get("Result", ""), props.get("ExecMainStatus", ""))
        return f"{how}. Its last log lines:\n{log_tail(self.runner, self.log, lines) or '(its log is empty)'}"

    def stop_server(self) -> None:
        if self.bench_installed:
            _systemctl(self.runner, self.sudo, "stop", BENCH_UNIT)

    def restore(self, health_timeout: float = 180.0) -> ServiceState:
        """Remove the bench unit; start the deployed unit again if it ran before. Returns the state now."""
        if self.bench_installed:
            self._priv(unit_remove_argv(self.agent, BENCH_UNIT), check=False)
            self.bench_installed = False
        before = self.before
        if before is not None:
            now_active = _systemctl(self.runner, self.sudo, "is-active", "--quiet", self.unit)
            if before.active and not now_active:
                # `start`, not `restart` + `enable`: the enabled state stays what it was.
                _systemctl(self.runner, self.sudo, "start", self.unit, check=True)
                try:
                    wait_ready(self.runner, self.main_port, health_timeout)
                except TimeoutError as exc:
                    raise EdgekitError(f"The deployed service on board {self.runner.name!r} was started again but "
                                       f"is not ready: {exc}.") from None
            elif not before.active and now_active:
                _systemctl(self.runner, self.sudo, "stop", self.unit)
        return ServiceState.read(self.runner, self.base, self.unit)
