"""`watchdog`: the board's own check of the release it serves, run as a unit of its own (edgekit-watchdog.service):

    python3 <base>/releases/<id>/agent/edgekit_agent.py watchdog --base B --port P --unit U --log L
        [--candidate-log CL] [--every S] [--timeout S] [--failures N] [--restarts M] [--window S]
        [--start-grace S] [--max-log-bytes B]

systemd restarts a server that crashes (Restart=on-failure); one that is alive but wedged (a deadlock, a stopped
process, a GPU hang) it never notices. This probes /health every ``--every`` s; ``--failures`` probes in a row
without a 200 within ``--timeout`` restart the service, and a release restarted ``--restarts`` times within
``--window`` s is replaced by the release the board served before it (its unit installed and started, `current`
and `serving` switched), as balena's rollback-health does. After any (re)start, probes do not count until the
server first answers or ``--start-grace`` s pass: a large model takes minutes to load.

It stands aside while the service is stopped (someone stopped it: a bench, an operator) and while an activation
holds the board's lock (a deploy or rollback is changing the service). What it did is in ``<base>/watchdog.json``
(restarts, the last failure, a rollback), which `edgekit status` shows.

It also keeps the service's logs bounded: a log over ``--max-log-bytes`` is copied to ``<log>.1`` and truncated in
place (logrotate's copytruncate: the server appends with O_APPEND and goes on writing at the new end).
Standard library only (Python 3.8).
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import shutil
import time
from contextlib import suppress
from typing import Any, Callable

from . import health
from .activate import _restore, _serve
from .board_releases import Layout
from .units import Units

STATE = "watchdog.json"
KEEP_RESTARTS = 20  # the newest restarts kept in the record


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


class Watch:
    def __init__(self, args: argparse.Namespace, units: Units, clock: Callable[[], float] = time.monotonic) -> None:
        self.args, self.units, self.clock = args, units, clock
        self.lay = Layout(args.base)
        self.failures = 0
        self.grace_until = clock() + args.start_grace  # the service may have just been (re)started
        self.restarted_at: dict[str, list[float]] = {}  # release → monotonic times of its restarts
        self.state = self._load()

    # ------------------------------------------------------------------ the record

    def _load(self) -> dict[str, Any]:
        try:
            with open(self.lay.path(STATE)) as fh:
                data = json.load(fh)
            return data if isinstance(data, dict) else {}
        except (OSError, ValueError):
            return {}

    def _save(self) -> None:
        path = self.lay.path(STATE)
        tmp = f"{path}.tmp"
        try:
            with open(tmp, "w") as fh:
                json.dump(self.state, fh, sort_keys=True)
            os.replace(tmp, path)
        except OSError:  # a full disk: the next round writes it again
            pass

    # ------------------------------------------------------------------ one round

    def probe(self) -> str | None:
        """None when /health answers 200 in time, else why not."""
        try:
            status, _ = health.Server(self.args.port).request("GET", "/health", None, self.args.timeout)
        except ConnectionError as exc:
            return str(exc)
        return None if status == 200 else f"/health answered {status}"

    def round(self) -> str | None:
        """One probe (and what follows from it); returns what it did, if anything."""
        cap_logs([self.args.log, self.args.candidate_log], self.args.max_log_bytes)
        reason = self.probe()
        if reason is None:
            self.failures, self.grace_until = 0, 0.0
            return None
        # Asked only now: a healthy board costs a probe a round, not a systemctl too.
        if self.clock() < self.grace_until or not self.units.active(self.args.unit):
            self.failures = 0
            return None
        self.failures += 1
        release = self.lay.serving or self.lay.current
        self.state["last_failure"] = {"at": _now(), "release": release, "reason": reason,
                                      "in_a_row": self.failures}
        self._save()
        if self.failures < self.args.failures:
            return None
        return self._act(release, reason)

    def _act(self, release: str | None, reason: str) -> str | None:
        with activation_lock(self.args.base) as held:
            if not held:  # a deploy or rollback is changing the service: it checks what it starts
                self.failures = 0
                return None
            now = self.clock()
            times = [t for t in self.restarted_at.get(release or "", []) if now - t < self.args.window]
            previous = self.lay.previous()
            if len(times) >= self.args.restarts and previous:
                back = _restore(self.lay, self.units, self.args, previous)
                self.state["rolled_back"] = {"at": _now(), "from": release, "to": back, "reason": reason,
                                             "restarts": len(times)}
                done = f"rolled back from {release} to {back}"
            else:
                self.units.restart(self.args.unit)
                times.append(now)
                kept = (self.state.get("restarts") or [])[-(KEEP_RESTARTS - 1):]
                self.state["restarts"] = [*kept, {"at": _now(), "release": release, "reason": reason}]
                done = f"restarted {self.args.unit} ({reason})"
            self.restarted_at[release or ""] = times
            self.failures, self.grace_until = 0, now + self.args.start_grace
            self._save()
            return done

    def reconcile(self) -> str | None:
        """As the watchdog starts (at boot, after a power cut): the service must run `current`. A cut during an
        activation can leave the unit installed for a release that never passed its check (restarted on it, then
        the power went before `current` switched); that release is not served, `current` is."""
        with activation_lock(self.args.base) as held:
            current, installed = self.lay.current, installed_release(self.args.unit, self.lay)
            if not held or not current or installed in (None, current):
                return None
            _serve(self.lay, self.units, self.args, current)
            self.lay.mark_serving(current)
            self.state["reconciled"] = {"at": _now(), "unit_had": installed, "current": current}
            self._save()
            return f"{self.args.unit} ran {installed}, not current {current}: restarted on {current}"

    def run(self) -> int:
        with suppress(OSError, RuntimeError):  # the round's probes see what is left
            did = self.reconcile()
            if did:
                print(f"{_now()} {did}", flush=True)
        while True:
            started = self.clock()
            try:
                did = self.round()
            except (OSError, RuntimeError) as exc:  # a unit the board refused: tried again next round
                did = f"failed: {exc}"
            if did:
                print(f"{_now()} {did}", flush=True)
            time.sleep(max(0.0, self.args.every - (self.clock() - started)))


class activation_lock:
    """The board's activation lock (agent/activate.py), taken only if free: ``with activation_lock(b) as held``."""

    def __init__(self, base: str) -> None:
        self.path = os.path.join(base, ".activate.lock")
        self.fd = -1

    def __enter__(self) -> bool:
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            return False

    def __exit__(self, *_exc: object) -> None:
        os.close(self.fd)


def installed_release(unit: str, lay: Layout) -> str | None:
    """The release the installed unit runs (its WorkingDirectory=<base>/releases/<id>), None without one."""
    prefix = f"WorkingDirectory={lay.path('releases')}/"
    try:
        with open(health.installed_unit(unit)) as fh:
            return next((line.strip()[len(prefix):] for line in fh if line.startswith(prefix)), None)
    except OSError:
        return None


def cap_logs(paths: list[str], max_bytes: int) -> None:
    """Each log over ``max_bytes``: copied to ``<log>.1`` (the one before it dropped), then truncated in place."""
    for path in paths:
        try:
            if not path or os.path.getsize(path) <= max_bytes:
                continue
            shutil.copyfile(path, f"{path}.1")
            with open(path, "r+b") as fh:
                fh.truncate(0)
        except OSError:  # gone, or a full disk: the next round tries again
            continue


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--base", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--unit", required=True)
    p.add_argument("--log", required=True)
    p.add_argument("--candidate-log", default="")
    p.add_argument("--legacy-unit", action="append", default=[])
    p.add_argument("--every", type=float, default=10.0)
    p.add_argument("--timeout", type=float, default=5.0)
    p.add_argument("--failures", type=int, default=3)
    p.add_argument("--restarts", type=int, default=3)
    p.add_argument("--window", type=float, default=1800.0)
    p.add_argument("--start-grace", type=float, default=600.0)
    p.add_argument("--max-log-bytes", type=int, default=64 << 20)


def main(args: argparse.Namespace) -> int:
    return Watch(args, Units()).run()
