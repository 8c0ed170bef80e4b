"""The systemd units that run a release's server from its directory (the main one, and a candidate beside it)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from edgekit.agent import unitspec
from edgekit.errors import EdgekitError

UNIT_NAME = "edgekit-serve.service"
CANDIDATE_UNIT = "edgekit-serve-candidate.service"  # a new release, health-checked beside the old one
WATCHDOG_UNIT = "edgekit-watchdog.service"  # restarts a wedged server, caps its logs (agent/watchdog.py)
WATCHDOG_LOG_NAME = "watchdog.log"
LOG_NAME, CANDIDATE_LOG_NAME = "server.log", "server-candidate.log"  # under <base>/logs/
# The service's names before they were engine-neutral (edgekit 0.1 up to the board-side activation), and where
# that unit logs. A board such an edgekit deployed is upgraded by the next activation (the old unit stopped and
# removed as the new one starts); its releases carry unit text, not specs, so they are redeployed, not rolled back to.
LEGACY_UNITS = {"edgekit-llama.service": "llama-server.log"}
LEGACY_CANDIDATE_UNITS = ("edgekit-llama-candidate.service",)  # removed before a candidate takes the port


def run_as_fields(user: str | None) -> dict[str, str]:
    """What release.json (and so the release id) says of who its units run as; nothing for root."""
    return {"run_as": user} if user else {}


def service_log(base: str, candidate: bool = False) -> str:
    return f"{base}/logs/{CANDIDATE_LOG_NAME if candidate else LOG_NAME}"


def activation_program(base: str, rid: str) -> list[str]:
    """The program that switches these units (agent/activate.py, carried by every release) as argv; -B: running
    it never writes bytecode into the release, which stays byte for byte what was pushed."""
    return activation_program_at(f"{base}/releases/{rid}")


def activation_program_at(release_dir: str) -> list[str]:
    return ["python3", "-B", f"{release_dir}/agent/edgekit_agent.py"]


def unit_install_argv(agent_release_dir: str, base: str, rid: str, unit: str) -> list[str]:
    """The agent of ``agent_release_dir`` installing release ``rid``'s ``unit`` from the spec it carries."""
    return [*activation_program_at(agent_release_dir), "unit-install", "--base", base, "--release", rid,
            "--unit", unit]


def unit_install_spec_argv(agent: Sequence[str], spec_file: str) -> list[str]:
    """The agent (its argv: ``python3 <zipapp>``) installing the unit of a spec file on the board (the bench's own
    unit)."""
    return [*agent, "unit-install", "--spec", spec_file]


def unit_remove_argv(agent: Sequence[str], unit: str) -> list[str]:
    return [*agent, "unit-remove", "--unit", unit]


def unit_spec(unit: str, role: str, base: str, rid: str, argv: Sequence[str], log: str, user: str | None,
              environment: Mapping[str, str] | None = None, env_file: str | None = None,
              key_file: str | None = None, restart: str = "on-failure", hardening: str = "default",
              writable: Sequence[str] = ()) -> dict[str, Any]:
    """A unit's spec (agent/unitspec.py), checked here already so a bad value stops the deploy on the workstation.

    The board renders the unit from it (the root helper, or the agent on a root or full-sudo board): a release
    carries its units as specs (``units.json``), never as unit text. ``user``: the unit runs as that user (the
    login user where it is not root); ``key_file``: the server refuses to start while it holds no proper key;
    ``writable``: what the server writes besides its log, under ``hardening: strict``."""
    spec = {"unit": unit, "role": role, "base": base, "release": rid, "argv": list(argv),
            "env": dict(environment or {}), "log": log, "env_file": env_file, "key_file": key_file,
            "restart": restart, "user": user, "hardening": hardening, "writable": list(writable)}
    try:
        return unitspec.check(spec, "root")
    except unitspec.BadSpec as exc:
        raise EdgekitError(f"The {role} unit of release {rid} cannot be written: {exc}.") from None


def render_unit(spec: Mapping[str, Any]) -> str:
    """The unit text the board will install for ``spec`` (the one renderer: agent/unitspec.py)."""
    return unitspec.render(dict(spec))


def watchdog_argv(base: str, rid: str, port: int, every_s: float, timeout_s: float, failures: int, restarts: int,
                  window_s: float, start_grace_s: float) -> list[str]:
    """The release's watchdog (agent/watchdog.py) over the main unit on ``port``."""
    return [*activation_program(base, rid), "watchdog", "--base", base, "--port", str(port), "--unit", UNIT_NAME,
            "--log", service_log(base), "--candidate-log", service_log(base, candidate=True),
            *(arg for unit in LEGACY_UNITS for arg in ("--legacy-unit", unit)),
            "--every", f"{every_s:g}", "--timeout", f"{timeout_s:g}", "--failures", str(failures),
            "--restarts", str(restarts), "--window", f"{window_s:g}", "--start-grace", f"{start_grace_s:g}"]
