"""edgekit's board commands for the fleet playbooks: shell lines of quoted argument lists.

Each mirrors one edgekit function (named beside it) and runs the same verbs of edgekit's agent (the zipapp
named in the plan's ``edgekit_fleet.agent``), so a board updated by Ansible ends up exactly like one updated
by `edgekit deploy`. The roles call them through the
filters in edgekit/data/ansible/plugins/filter/edgekit_commands.py: Ansible 2.19 compiles every template anew in
each worker, and the same commands written as Jinja cost the controller ≈ 40 ms of CPU per board.
Standard library only: Ansible's workers import this module.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from edgekit.agent.activate import DRAFT_COUNTERS_ENV
from edgekit.agent.health import check_options, command_args
from edgekit.release.units import CANDIDATE_LOG_NAME, LOG_NAME, activation_program, unit_install_argv


def q(argv: Sequence[str]) -> str:
    """One command line from an argument list (what Jinja's ``map('quote') | join(' ')`` made)."""
    return shlex.join(str(a) for a in argv)


@dataclass(frozen=True)
class Serve:
    """What the health check of a release needs, from its manifest (or the rollout's plan)."""

    port: int
    drafter: bool = False
    engine: str = "llama.cpp"
    model: str = ""
    gpu: str = "none"
    chat: bool = False
    media: str = ""  # "image,audio": what its mmproj takes
    key_file: str = ""  # the board's API key file (runtime.auth: key): the check sends the key
    draft_counters: str = ""  # "drafted,accepted": the /metrics counters its engine names (dialect openai)

    @classmethod
    def of_manifest(cls, m: Mapping[str, Any]) -> Serve:
        """A release.json read on the board; an older release may lack any field."""
        # Standard library only: this runs in every Ansible worker (pydantic would cost each one ~150 ms), and a
        # manifest's lists are lazy there. The defaults are ReleaseManifest's (tests/test_release_manifest.py).
        return cls(int(m.get("port") or 8080), bool(m.get("drafter")), str(m.get("engine") or "llama.cpp"),
                   str(m.get("recipe") or ""), str(m.get("gpu") or "none"), bool(m.get("chat")),
                   ",".join(str(x) for x in m.get("media") or []), str(m.get("api_key_file") or ""),
                   ",".join(str(x) for x in m.get("draft_counters") or []))

    @classmethod
    def of_plan(cls, plan: Mapping[str, Any], port: int) -> Serve:
        return cls(int(port), bool(plan["drafter"]), str(plan["engine"]), str(plan["model"]), str(plan["gpu"]),
                   bool(plan["chat"]), str(plan["media"]), str(plan.get("key_file") or ""),
                   str(plan.get("draft_counters") or ""))


class Board:
    """The commands for one board: its base directory and sudo prefix ([] as root, else [sudo, -n])."""

    def __init__(self, fleet: Mapping[str, Any], base: str, sudo: Sequence[str] = ()) -> None:
        agent = fleet["agent"]  # put on the board by the push (edgekit_blobs) before any command here runs
        self.agent = [str(agent["python"]), f"{base}/{agent['dir']}/{agent['name']}"]
        self.units: Mapping[str, str] = fleet["units"]
        self.health_settings: Mapping[str, Any] = fleet["health"]
        self.base = str(base)
        self.sudo = [str(s) for s in sudo]

    def _systemctl(self, *args: str) -> str:
        return q([*self.sudo, "systemctl", *args])

    def start(self, unit: str, release: str) -> str:
        """The unit installed from the release's spec by its agent (agent/units.py: through the root helper where
        the board has it), enabled (may fail) and restarted; one round trip."""
        install = q(unit_install_argv(f"{self.base}/releases/{release}", self.base, release, unit))
        return f"{install} && {{ {self._systemctl('enable', unit)} || true; }} && {self._systemctl('restart', unit)}"

    def stop(self, unit: str) -> str:
        return self._systemctl("stop", unit)

    def switch(self, release: str) -> str:
        """`current` and `serving` to ``release``: the rescue of a program that did not finish (it does this itself)."""
        return q([*self.agent, "release-switch", "--serving", self.base, release])

    def log(self, unit: str) -> str:
        return f"{self.base}/logs/{CANDIDATE_LOG_NAME if unit == self.units['candidate'] else LOG_NAME}"

    def logs(self, unit: str, lines: int = 20) -> str:
        """service.log_tail."""
        return q(["tail", "-n", str(lines), self.log(unit)])

    def health(self, unit: str, serve: Serve) -> str:
        """edgekit's health check (edgekit/agent/health.py, as deploy runs it): prints the Health as JSON, exits 0.
        In the dialect of the release's engine, with its GPU policy read from the unit's own log; through its chat
        template and with an image and a second of audio where it serves an mmproj."""
        counters = self._counters(serve)
        args = command_args(serve.port, unit=unit, log=self.log(unit), draft_counters=counters.split(",") if counters
                            else (), **self._check_settings(serve))
        return q([*self.agent, "health", *args])

    def check_current(self, serve: Serve) -> str:
        """The check of the release the service runs (--check rollouts): prints its Health (read by ``checked``)."""
        return self.health(self.units["main"], serve)

    def activate(self, release: str, serve: Serve, keep: int, previous: str | None, *, check_first: bool = False,
                 candidate: Serve | None = None) -> str:
        """edgekit's activation, by the board-side program the release carries (agent/activate.py, what
        `edgekit deploy` runs too), one round trip. A board that serves the release already is checked first and
        left alone when healthy (``check_first``). With ``candidate``, the release starts on the spare port beside
        the serving one, is checked and removed; only if it passed is the service restarted on it and checked;
        then the check is recorded, `current` and `serving` switch and old releases are pruned; a failed check
        puts ``previous`` back. Stdout: ``begin STEP`` and ``STEP HEALTH-JSON`` lines (see ``activation``), then
        ``result {…}``."""
        main, cand = self.units["main"], self.units["candidate"]
        argv = [*self._counters_env(serve), *activation_program(self.base, release), "activate", "--base", self.base,
                "--release", release, "--port", str(serve.port), "--unit", main, "--log", self.log(main),
                "--candidate-unit", cand, "--candidate-log", self.log(cand),
                "--candidate-port", str(candidate.port if candidate else 0),
                "--strategy", "candidate" if candidate is not None else "in-place", "--keep", str(keep),
                *self._unit_options(), *check_options(**self._check_settings(serve))]
        argv += ["--check-first"] if check_first else []
        return q(argv)

    def rollback(self, release: str, serve: Serve, via: str) -> str:
        """edgekit's rollback by the board's program (the one release ``via`` carries): ``release`` restarted in
        place and checked, `current` switched only when it is healthy, else the release it had put back."""
        main = self.units["main"]
        return q([*self._counters_env(serve), *activation_program(self.base, via), "rollback", "--base", self.base,
                  "--release", release,
                  "--port", str(serve.port), "--unit", main, "--log", self.log(main), *self._unit_options(),
                  *check_options(**self._check_settings(serve))])

    def _counters(self, serve: Serve) -> str:
        """"drafted,accepted": the release's own draft counters, else its engine's (a release made before)."""
        return serve.draft_counters or str(self.health_settings.get("counters", {}).get(serve.engine, ""))

    def _counters_env(self, serve: Serve) -> list[str]:
        """What a board's program reads where the release's release.json names no counters (agent/activate.py)."""
        counters = self._counters(serve)
        return ["env", f"{DRAFT_COUNTERS_ENV}={counters}"] if counters else []

    def _unit_options(self) -> list[str]:
        """The watchdog's unit; the service's older names (release.units.LEGACY_UNITS): the program removes them as
        it starts it, and an older edgekit's candidate before one starts."""
        watchdog = self.units.get("watchdog")
        return [*(["--watchdog-unit", str(watchdog)] if watchdog else []),
                *(arg for unit in self.units.get("legacy") or [] for arg in ("--legacy-unit", str(unit))),
                *(arg for unit in self.units.get("stale") or [] for arg in ("--stale-unit", str(unit)))]

    def _check_settings(self, serve: Serve) -> dict[str, Any]:
        """How the board's check asks ``serve`` (agent/health.py check_options' keywords), in its engine's dialect
        from the plan's table."""
        h = self.health_settings
        if serve.engine not in h["apis"]:  # a release of an engine this edgekit was not given (EDGEKIT_ENGINES)
            raise ValueError(f"the release's engine {serve.engine!r} is not one this edgekit knows "
                             f"({', '.join(h['apis'])}); register it with EDGEKIT_ENGINES")
        return {"drafter": serve.drafter, "timeout": float(h["timeout"]), "n_predict": int(h["n_predict"]),
                "prompt": str(h["prompt"]), "api": str(h["apis"][serve.engine]), "model": serve.model,
                "gpu": serve.gpu, "chat": serve.chat, "media": [k for k in serve.media.split(",") if k],
                "key_file": serve.key_file}


STEPS = ("current", "candidate", "main")


def _pick(commands: Mapping[str, Callable[[], str]], which: str, kind: str) -> str:
    if which not in commands:
        raise ValueError(f"no {kind} command {which!r} (one of {', '.join(commands)})")
    return commands[which]()


def activation(stdout: str) -> dict[str, Any]:
    """What Board.activate printed: the Health of each step it checked (current, candidate, main; None where
    it did not get there), the steps that started a unit (``begun``), whether the program finished (``finished``:
    it printed its result, having put the previous release back itself on a failure), whether it succeeded
    (``ok``: its result, else the last step), and whose log tells why not (``log``: the unit started last, the
    service's if none)."""
    out: dict[str, Any] = dict.fromkeys(STEPS)
    begun: list[str] = []
    result: dict[str, Any] | None = None
    for line in str(stdout or "").splitlines():
        step, _, rest = line.strip().partition(" ")
        if step == "begin" and rest in STEPS:
            begun.append(rest)
        elif step in STEPS and rest.startswith("{"):
            out[step] = json.loads(rest)
        elif step == "result" and rest.startswith("{"):
            result = json.loads(rest)
    if "main" in begun:
        decides = out["main"]
    elif begun:  # a candidate that passed is always followed by the service's restart
        decides = None
    else:
        decides = out["current"]
    ok = bool(result["ok"]) if result is not None else bool(decides and decides.get("ok"))
    return {**out, "begun": begun, "ok": ok, "finished": result is not None,
            "log": "candidate" if begun[-1:] == ["candidate"] else "main"}


def state_args(fleet: Mapping[str, Any], base: str, release: str = "", unit: str = "") -> list[str]:
    """The agent's `state` arguments (agent/board_state.py): base [--release R] [--unit U --older NAME...]."""
    argv = [str(base)] + (["--release", str(release)] if release else [])
    if unit:
        argv += ["--unit", str(unit), *(a for u in fleet["units"].get("legacy") or [] for a in ("--older", str(u)))]
    return argv


def rollout(plan: Mapping[str, Any], fleet: Mapping[str, Any], which: str) -> str:
    """A rollout's command for one board, from its plan and the state edgekit read before the playbook:
    ``activate`` (check_first for a board that serves the release; a candidate for a board that serves
    another), ``check`` (--check: only the check of a board that serves it), ``logs_main``,
    ``logs_candidate``, and the rescue's ``restore``, ``restore_switch``, ``stop``."""
    st = plan["state"]
    board = Board(fleet, plan["base"], st["sudo"])
    main, release, previous = board.units["main"], str(plan["release"]), str(st.get("current") or "")
    serve = Serve.of_plan(plan, plan["port"])
    candidate = Serve.of_plan(plan, plan["candidate_port"]) if plan["strategy"] == "candidate" and st.get("active") \
        else None
    commands = {
        "activate": lambda: board.activate(release, serve, int(plan["keep"]), previous, check_first=bool(st["serves"]),
                                           candidate=candidate),
        "check": lambda: board.check_current(serve),
        "logs_main": lambda: board.logs(main),
        "logs_candidate": lambda: board.logs(board.units["candidate"]),
        "restore": lambda: board.start(main, previous),
        "restore_switch": lambda: board.switch(previous),
        "stop": lambda: board.stop(main),
    }
    return _pick(commands, which, "rollout")


def _program_carrier(st: Mapping[str, Any], release: str) -> str:
    """The release whose activation program runs a rollback: the current one (this edgekit's, once it deployed
    there), else the target's own."""
    carriers = st.get("programs") or []
    for rid in (st.get("current"), release):
        if rid and rid in carriers:
            return str(rid)
    raise ValueError(f"neither release {st.get('current')} nor {release} on the board carries edgekit's activation "
                     "program (both predate it); deploy once with this edgekit, then roll back")


def checked(stdout: str) -> dict[str, Any]:
    """What Board.check_current printed (the agent's Health), in the shape ``activation`` gives: the check of the
    release the service runs, as its ``current`` step; nothing begun."""
    lines = [ln for ln in str(stdout or "").splitlines() if ln.strip().startswith("{")]
    return activation(f"current {lines[-1].strip()}" if lines else "")


def on_board(st: Mapping[str, Any], fleet: Mapping[str, Any], which: str, release: str,
             manifest: Mapping[str, Any] | None = None) -> str:
    """A rollback's or status's command for one board, from the state the agent's `state` read in the play."""
    board = Board(fleet, st["base"], st["sudo"])
    main = board.units["main"]
    serve = Serve.of_manifest(manifest) if manifest else Serve(8080)  # no current release: nothing to check
    commands = {
        "start": lambda: board.start(main, release),
        "switch": lambda: board.switch(release),
        "rollback": lambda: board.rollback(release, serve, _program_carrier(st, release)),
        "check": lambda: board.health(main, serve),
    }
    return _pick(commands, which, "board")
