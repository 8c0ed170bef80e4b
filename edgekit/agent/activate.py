"""`activate` / `rollback`: make a release the one the board serves, on the board, in one program — what
`edgekit deploy` and the fleet's roles both run (the release being activated carries it under agent/):

    python3 <base>/releases/<id>/agent/edgekit_agent.py activate --base B --release ID --port P
        [--candidate-port C] [--strategy candidate|in-place] [--keep K] [--check-first]
        --unit U --candidate-unit CU --log L --candidate-log CL   + the health check's options
    python3 <base>/releases/<current>/agent/edgekit_agent.py rollback --base B --release ID --port P ...

Never leaves the board serving nothing: with strategy "candidate" (and a service running) the release
starts as a second unit on the spare port and is checked while the old one serves; only then is the
service restarted on it and checked again, and only then are its check recorded, `current` and `serving`
switched and old releases pruned. A failed check puts the previous release back (or stops the service when
there was none). Prints ``begin STEP`` as a step starts a unit and ``STEP {Health}`` as it is checked
(steps: current, candidate, main), then ``result {…}``; exit 0 once it printed its result, 2 on bad input.
Standard library only (Python 3.8).

One activation at a time per board: the program holds ``<base>/.activate.lock`` (flock) while it works, so
an activation left running by a host that died is finished before the next one reads the board. With
``--host-holds-stdin`` (edgekit deploy keeps the session's stdin open) a host that dies before the service
is restarted abandons the activation: the candidate is removed and the board stays as it was; once the
service is being restarted the program finishes (checks, then switches or puts the previous release back).
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import threading
import time
from contextlib import contextmanager, suppress
from typing import Any, Callable, Iterator

from . import health
from .board_releases import Layout
from .units import OldRelease, Units, release_spec


class HostGone(Exception):
    """The host that started this activation is gone (its session's stdin closed) before the service restart."""


class Host:
    """Whether the host that started the program is still there: its session's stdin stays open until it dies
    (or is cut off). Without ``watch`` the host is assumed to stay (the fleet: Ansible closes stdin at once)."""

    def __init__(self, watch: bool) -> None:
        self.gone = threading.Event()
        if watch:
            threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        with suppress(OSError):  # no stdin at all: nobody holds it
            while os.read(0, 4096):
                pass
        self.gone.set()

    def still_there(self) -> None:
        if self.gone.is_set():
            raise HostGone()


LOCK_WAIT_S = 900  # an activation's longest run: two checks at the longest health timeout, and the restarts


@contextmanager
def board_lock(base: str, wait_s: float = LOCK_WAIT_S) -> Iterator[None]:
    """The board's activation lock, waited for: an earlier activation still running finishes first."""
    os.makedirs(base, exist_ok=True)
    fd = os.open(os.path.join(base, ".activate.lock"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"another activation has held {base}/.activate.lock for {wait_s:g} s") from None
                time.sleep(0.2)
        yield
    finally:
        os.close(fd)


def say(step: str, data: Any = None) -> None:
    """One line to the host. A host that is gone does not stop the program: half an activation is worse."""
    with suppress(OSError):  # BrokenPipeError: nobody reads stdout any more
        print(step if data is None else f"{step} {json.dumps(data, sort_keys=True)}", flush=True)


def _check(args: argparse.Namespace, port: int, unit: str, log: str) -> dict[str, Any]:
    ns = argparse.Namespace(**{**vars(args), "port": port, "unit": unit, "log": log,
                               "draft_counters": _draft_counters(args)})
    return health.check(ns)


# The host names the counters of a release that predates its engine naming them (an option would be refused by the
# activation program of such a release, which the host may run too): read only where release.json has none.
DRAFT_COUNTERS_ENV = "EDGEKIT_DRAFT_COUNTERS"


def _draft_counters(args: argparse.Namespace) -> list:
    """The /metrics counters of drafted and accepted tokens the release's engine names: release.json's
    ``draft_counters``, else ``$EDGEKIT_DRAFT_COUNTERS`` (none: its completion carries the draft counts itself)."""
    try:
        with open(os.path.join(args.base, "releases", args.release, "release.json")) as fh:
            found = json.load(fh).get("draft_counters")
    except (OSError, ValueError):
        found = None
    if found is None:
        found = [n for n in os.environ.get(DRAFT_COUNTERS_ENV, "").split(",") if n]
    return [str(n) for n in found][:2]


def _recorded(lay: Layout, rid: str, args: argparse.Namespace) -> dict[str, Any] | None:
    """The release's recorded full check, when it passed (with drafts where a drafter is configured) and
    /health answers now."""
    rec = lay.health(rid)
    if not rec or not rec.get("ok") or (args.drafter and not rec.get("draft_n")):
        return None
    try:
        if health.Server(args.port).request("GET", "/health", None, 5)[0] != 200:
            return None
    except ConnectionError:
        return None
    return dict(rec, reason="healthy (/health answered; tokens and drafts as recorded at activation)",
                method="recorded")


def activate(args: argparse.Namespace, units: Units, say: Callable[..., None] = say,
             host: Host | None = None) -> dict[str, Any]:
    host = host or Host(False)
    lay, rid = Layout(args.base), args.release
    if rid not in lay.releases():
        raise ValueError(f"no release {rid} under {args.base}/releases")
    previous = lay.current
    serves = units.active(args.unit) or any(units.active(u) for u in args.legacy_unit)
    out: dict[str, Any] = {"release": rid, "previous": previous, "changed": False, "strategy": args.strategy,
                           "pruned": [], "ok": False}
    if args.check_first and lay.current == rid and lay.serving == rid and serves:
        h = _recorded(lay, rid, args) or _check(args, args.port, args.unit, args.log)
        say("current", h)
        if h["ok"]:
            if h.get("method") != "recorded":
                _record(lay, rid, h, out)
            _watch(lay, units, args, rid)
            return dict(out, ok=True)
    strategy = args.strategy if serves else "in-place"  # with nothing serving, the service's start is the check
    out["strategy"] = strategy
    _remove_stale(units, args)
    units.claim(args.base)
    if strategy == "candidate":
        host.still_there()
        say("begin candidate")
        try:
            units.install(args.candidate_unit, _spec(args, rid, args.candidate_unit))
            units.restart(args.candidate_unit, enable=False)
            h = _check(args, args.candidate_port, args.candidate_unit, args.candidate_log)
        except RuntimeError as exc:
            h = health.unhealthy(f"the candidate did not start: {exc}", args.chat)
        finally:
            units.remove(args.candidate_unit)
        say("candidate", h)
        if not h["ok"]:
            return out
    host.still_there()  # the last point at which the board is as it was: past it, the program finishes
    say("begin main")
    h = _serve_and_check(lay, units, args, rid)
    say("main", h)
    if not h["ok"]:
        out["restored"] = _restore(lay, units, args, previous)
        return out
    _record(lay, rid, h, out)
    if not _switch(lay, units, args, rid, previous, out):
        return out
    _watch(lay, units, args, rid)
    try:
        out["pruned"] = lay.prune(args.keep, [rid, previous or ""])
    except OSError as exc:  # the next activation prunes again
        out["prune_error"] = str(exc)
    return dict(out, changed=True, ok=True)


def _remove_stale(units: Units, args: argparse.Namespace) -> None:
    """Units an older edgekit may have left (its candidate): one still running would hold the candidate port."""
    for stale in args.stale_unit:
        units.remove(stale)


def _spec(args: argparse.Namespace, rid: str, unit: str) -> dict[str, Any]:
    """The release's spec of ``unit`` (units.json); a release without one cannot be served (RuntimeError)."""
    try:
        spec = release_spec(args.base, rid, unit)
    except OldRelease as exc:
        raise RuntimeError(str(exc)) from None
    if spec is None:
        raise RuntimeError(f"release {rid} has no unit {unit}")
    return spec


def _serve(lay: Layout, units: Units, args: argparse.Namespace, rid: str) -> None:
    """The service (re)started on release ``rid``: its unit rendered from the release's spec and installed as
    ``args.unit``, the legacy units (an older edgekit's name of the service) stopped and removed first, so the port
    is free and a board is upgraded once."""
    units.install(args.unit, _spec(args, rid, args.unit))
    for old in args.legacy_unit:
        units.remove(old)
    units.restart(args.unit)


def _serve_and_check(lay: Layout, units: Units, args: argparse.Namespace, rid: str) -> dict[str, Any]:
    """The service on release ``rid``, checked; a unit that would not even start is a failed check."""
    try:
        _serve(lay, units, args, rid)
    except RuntimeError as exc:
        return health.unhealthy(f"the service did not start: {exc}", args.chat)
    return _check(args, args.port, args.unit, args.log)


def _record(lay: Layout, rid: str, h: dict[str, Any], out: dict[str, Any]) -> None:
    """The passed check beside the release; a record that cannot be written only costs the next redeploy a full
    check."""
    try:
        lay.record_health(rid, h)
    except OSError as exc:
        out["record_error"] = str(exc)


def _switch(lay: Layout, units: Units, args: argparse.Namespace, rid: str, back_to: str | None,
            out: dict[str, Any]) -> bool:
    """`current` and `serving` to ``rid``, which the service now runs. If the board refuses (a full disk), the
    service follows `current` back to ``back_to`` instead, and ``out`` says why."""
    try:
        lay.switch(rid)
        lay.mark_serving(rid)
        return True
    except OSError as exc:
        out.update(error=f"switching current to {rid} failed: {exc}", restored=_restore(lay, units, args, back_to))
        return False


def _restore(lay: Layout, units: Units, args: argparse.Namespace, previous: str | None) -> str | None:
    """The previous release back in service and `current` (or the service stopped when there was none); None when
    it could not be put back (the board says why in the unit's log)."""
    if previous is None:
        units.stop(args.unit)
        return None
    try:
        _serve(lay, units, args, previous)
    except RuntimeError:
        return None
    lay.switch(previous)
    lay.mark_serving(previous)
    _watch(lay, units, args, previous)
    return previous


def _watch(lay: Layout, units: Units, args: argparse.Namespace, rid: str) -> None:
    """The watchdog of the release now served (its own unit file) replaces the one running; a release without one
    (its recipe turned it off, or an older edgekit made it) runs none. Not asked for (no --watchdog-unit: the
    watchdog itself, rolling back) it is left alone. A watchdog systemd refuses leaves the service as switched."""
    unit = getattr(args, "watchdog_unit", "")
    if not unit:
        return
    with suppress(RuntimeError, OldRelease):
        spec = release_spec(args.base, rid, unit)
        if spec is not None:
            units.install(unit, spec)
            units.restart(unit)
        else:
            units.remove(unit)


def rollback(args: argparse.Namespace, units: Units, say: Callable[..., None] = say) -> dict[str, Any]:
    """``args.release`` (an earlier release) restarted in place and checked; `current` switches only if it is
    healthy, else the release it had is put back."""
    lay, rid = Layout(args.base), args.release
    if rid not in lay.releases():
        raise ValueError(f"no release {rid} under {args.base}/releases")
    release_spec(args.base, rid, args.unit)  # OldRelease (a ValueError): refused before anything is touched
    had = lay.current
    _remove_stale(units, args)
    units.claim(args.base)
    say("begin main")
    h = _serve_and_check(lay, units, args, rid)
    say("main", h)
    out = {"release": rid, "previous": had, "changed": False, "strategy": "rollback", "pruned": [], "ok": h["ok"]}
    if not h["ok"]:
        out["restored"] = _restore(lay, units, args, had)
        return out
    if not _switch(lay, units, args, rid, had, out):
        return dict(out, ok=False)
    _watch(lay, units, args, rid)
    return dict(out, changed=True)


def add_arguments(p: argparse.ArgumentParser, rollback_only: bool = False) -> None:
    p.add_argument("--base", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--release", required=True)
    p.add_argument("--unit", required=True)
    p.add_argument("--log", required=True)
    p.add_argument("--stale-unit", action="append", default=[],
                   help="a unit an older edgekit may have left (its candidate): removed first (repeatable)")
    p.add_argument("--legacy-unit", action="append", default=[],
                   help="an older name of the service: stopped and removed when this one starts (repeatable)")
    p.add_argument("--watchdog-unit", default="",
                   help="the watchdog's unit: the served release's own is (re)started with it, or removed")
    if not rollback_only:
        p.add_argument("--host-holds-stdin", action="store_true",
                       help="stdin closes when the host dies: abandon the activation before the service restarts")
        p.add_argument("--candidate-unit", default="")
        p.add_argument("--candidate-log", default="")
        p.add_argument("--candidate-port", type=int, default=0)
        p.add_argument("--strategy", choices=["candidate", "in-place"], default="candidate")
        p.add_argument("--keep", type=int, default=3)
        p.add_argument("--check-first", action="store_true")
    health.add_check_arguments(p)
