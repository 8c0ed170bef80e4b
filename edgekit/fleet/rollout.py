"""`edgekit fleet rollout|rollback|status`: select boards, prepare once, let Ansible do the boards."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from edgekit.config.boardfile import BoardFile
from edgekit.config.recipes import Recipe
from edgekit.deploy import api_key, memory_fit
from edgekit.deploy.pipeline import DeployOptions
from edgekit.engines import get_engine
from edgekit.engines.board_check import board_file as board_file_at
from edgekit.engines.recipe_check import load_recipe
from edgekit.errors import EdgekitError
from edgekit.fleet import inventory as inv
from edgekit.fleet import sites
from edgekit.fleet.connect import Fleet
from edgekit.fleet.current import already_current
from edgekit.fleet.plan import FleetPlan, fleet_vars, plan_fleet, rollout_vars
from edgekit.fleet.playbook import Batch, largest_batch, preflight, run_playbook
from edgekit.fleet.report import FleetSummary, activation_report, summarize

CANARY_GROUP = "canary"
RUN_CANARY_GROUP = "edgekit_canary"  # what rollout.yml's first play targets


@dataclass
class RolloutOptions:
    recipe: str
    group: str | None = None
    batches: list[Batch] = field(default_factory=lambda: [1, "25%", "100%"])
    max_fail: int = 0
    check: bool = False
    canary: str | None = None  # a group or board; None → the `canary` group, else the first board
    no_canary: bool = False
    src: str | None = None
    strategy: str = "auto"
    keep: int | None = None
    health_timeout: float = 180.0
    forks: int | None = None
    wait_s: int = 0


def choose_canary(data: BoardFile, names: list[str], spec: str | None, none: bool = False) -> list[str]:
    """The canary boards among ``names``: ``spec`` (group or board), else the `canary` group, else the first."""
    if none or not names:
        return []
    if spec is not None:
        chosen = [n for n in inv.select(data, group=spec) if n in names]
        if not chosen:
            raise EdgekitError(f"The canary {spec!r} names none of the boards selected for this rollout.")
        return chosen
    in_group = [n for n in data.groups.get(CANARY_GROUP, []) if n in names]
    return in_group or names[:1]


def run_inventory(data: BoardFile, names: list[str], canary: list[str]) -> dict[str, Any]:
    rendered = inv.render(data, names)
    children = rendered["all"].setdefault("children", {})
    children[RUN_CANARY_GROUP] = {"hosts": {n: None for n in canary}}
    return rendered


def _printer(console: Console, quiet: bool) -> Callable[[str], None] | None:
    if quiet:
        return None
    return lambda line: console.print(line, markup=False, highlight=False, soft_wrap=True)


def _warn(console: Console) -> Callable[[str], None]:
    return lambda msg: console.print(f"[yellow]warning:[/yellow] {msg}")


def rollout(board_file: Path, options: RolloutOptions, console: Console, quiet: bool = False) -> FleetSummary:
    start = time.monotonic()
    preflight(_warn(console))
    data = board_file_at(board_file).load()
    names = inv.select(data, group=options.group)
    if not names:
        raise EdgekitError(f"No boards to roll out to in {board_file}.")
    recipe = load_recipe(options.recipe)
    get_engine(recipe.runtime.engine).check_host_needs(recipe)  # before any board is contacted
    canary = choose_canary(data, names, options.canary, options.no_canary)
    deploy_opts = DeployOptions(src=options.src, strategy=options.strategy, wait_s=options.wait_s,
                                health_timeout_s=options.health_timeout, keep=options.keep)
    console.print(f"[dim]fleet: connecting to {len(names)} board(s), probing"
                  f"{'' if options.check else ' and locking'} them[/dim]")
    with Fleet({n: data.boards[n] for n in names}, lock=not options.check, wait_s=options.wait_s) as fleet:
        if any(n in fleet.failed for n in canary) or not fleet.targets:
            return _stopped(names, fleet.failed, options.check, start, fleet.phases)
        refused = _recipe_refused(fleet, recipe)  # before a model is downloaded or a build made for them
        if any(n in refused for n in canary) or len(refused) == len(fleet.targets):
            return _stopped(names, fleet.failed, options.check, start, fleet.phases)
        fp = plan_fleet(recipe, {n: t for n, t in fleet.targets.items() if n not in refused}, deploy_opts, console)
        found, unread = already_current(fleet, fp)
        fleet.failed.update(unread)
        if any(n in unread for n in canary) or not found:
            return _stopped(names, fleet.failed, options.check, start, fleet.phases)
        # --check sends every board through the playbook, which says what it would do to each.
        current = {} if options.check else {n: f.report for n, f in found.items() if f.report is not None}
        left_alone = {n: {"touched": True, "stats": {}, "data": {"edgekit": r}} for n, r in current.items()}
        if current and len(current) == len(found):
            console.print(f"[dim]fleet: all {len(current)} board(s) already serve their planned release and "
                          "answer /health: nothing to do, no playbook run[/dim]")
            summary = summarize("rollout", names, {"hosts": left_alone}, fleet.failed, phases=fleet.phases)
            summary.seconds = round(time.monotonic() - start, 2)
            summary.extra = {"recipe": recipe.name, "canary": canary, "planned": fp.releases(), "builds": fp.builds,
                             "ansible_seconds": 0.0, "ansible_rc": None, "playbook": "skipped: nothing to do"}
            return summary
        extra = rollout_vars(fp, options.health_timeout)
        for name, f in found.items():  # read under the lock the run holds: the playbook reads none itself
            extra["edgekit_plans"][name]["state"] = f.state
        extra.update({"edgekit_serial": options.batches, "edgekit_max_fail": options.max_fail})
        # Boards that already serve their release and answer /health are reported as they are (as when
        # all do); the playbook runs for the rest only. A canary already serving the release has passed.
        limit = _memory_fits(fleet, fp, recipe, [n for n in fleet.targets if n in found and n not in current])
        if not options.check:
            limit = _keys_placed(fleet, extra["edgekit_plans"], limit)
        if any(n in fleet.failed for n in canary) or not limit:
            return _stopped(names, fleet.failed, options.check, start, fleet.phases)
        run_canary = [n for n in canary if n in limit]
        forks = options.forks or max(1, largest_batch(options.batches, len(limit)))
        # Sites: seeds take the blobs now; their boards pull in the playbook, each in its batch.
        with contextlib.nullcontext(sites.Staged()) if options.check else sites.serving(
                fleet, fp, limit, run_canary, lambda m: console.print(f"[dim]fleet: {m}[/dim]")) as staged:
            for name, pull in staged.pulls.items():
                extra["edgekit_plans"][name]["site"] = pull
            console.print(f"[dim]fleet: ansible-playbook rollout.yml on {len(limit)} board(s)"
                          f"{f' ({len(current)} already current)' if current else ''}: canary "
                          f"{', '.join(run_canary) or 'none'}, batches {options.batches}, max fail "
                          f"{options.max_fail}%, forks {forks}{', check mode' if options.check else ''}[/dim]")
            run = run_playbook("rollout.yml", run_inventory(data, limit, run_canary), extra, limit, forks=forks,
                               check=options.check, on_line=_printer(console, quiet), color=console.is_terminal,
                               control=fleet.control, hold=fleet.lock_fds())
    hosts = run.report.get("hosts") or {}
    site_reports = staged.collect(hosts)
    for name, host in hosts.items():  # a success sets no stats: its report is made here (failures set theirs)
        if not host.get("failures") and not host.get("unreachable") and not host.get("data"):
            made = activation_report(extra["edgekit_plans"][name], host.get("registered") or {}, options.check)
            if made is not None:
                host["data"] = {"edgekit": made}
    report = {**run.report, "hosts": {**left_alone, **hosts}}
    summary = summarize("rollout", names, report, fleet.failed, options.check, fleet.phases)
    summary.seconds = round(time.monotonic() - start, 2)
    summary.extra = {"recipe": recipe.name, "canary": canary, "batches": options.batches,
                     "max_fail_percentage": options.max_fail, "planned": fp.releases(), "builds": fp.builds,
                     "ansible_seconds": run.seconds, "ansible_rc": run.rc, "log": str(run.log),
                     "task_seconds": run.report.get("tasks", []), "sites": site_reports}
    return summary


def _recipe_refused(fleet: Fleet, recipe: Recipe) -> set[str]:
    """The boards whose memory cannot hold the recipe of published models (as `deploy` checks it before it
    downloads): each fails alone, with the numbers, and nothing is made for it."""
    engine = get_engine(recipe.runtime.engine)
    refused = set()
    for name, target in fleet.targets.items():
        try:
            memory_fit.check_recipe(target.runner, name, target.facts, target.board.profile, recipe, engine,
                                    lambda _msg: None)
        except EdgekitError as exc:
            fleet.failed[name], fleet.phases[name] = str(exc), "memory"
            refused.add(name)
    return refused


def _memory_fits(fleet: Fleet, fp: FleetPlan, recipe: Recipe, names: list[str]) -> list[str]:
    """The boards whose memory holds their release (as `deploy` checks it); one that cannot fails alone, with the
    numbers, and is sent nothing."""
    engine = get_engine(recipe.runtime.engine)
    fits = []
    for name in names:
        target, bp = fleet.targets[name], fp.boards[name]
        try:
            memory_fit.check(target.runner, name, target.facts, bp.plan, engine.kv_cache_bytes(bp.plan, recipe),
                             in_place=bp.strategy == "in-place",
                             compute_bytes=engine.compute_buffer_bytes(bp.plan, recipe))
        except EdgekitError as exc:
            fleet.failed[name], fleet.phases[name] = str(exc), "memory"
            continue
        fits.append(name)
    return fits


def _keys_placed(fleet: Fleet, plans: dict[str, Any], names: list[str]) -> list[str]:
    """The boards whose release asks for an API key get theirs before the playbook starts it (over each
    board's own connection: the key never goes into the playbook's variables); a board whose key cannot be
    placed fails alone."""
    ready = []
    for name in names:
        if plans[name].get("key_file"):
            target = fleet.targets[name]
            try:
                api_key.install(target.runner, target.facts.base, name, plans[name]["engine"])
            except EdgekitError as exc:
                fleet.failed[name], fleet.phases[name] = str(exc), "key"
                continue
        ready.append(name)
    return ready


def _stopped(names: list[str], failed: dict[str, str], check: bool, start: float,
             phases: dict[str, str] | None = None) -> FleetSummary:
    """The canary (or every board) failed before the playbook: nothing else is touched."""
    summary = summarize("rollout", names, {}, failed, check, phases)
    summary.untouched = [n for n in names if n not in failed]
    summary.stopped = True
    summary.seconds = round(time.monotonic() - start, 2)
    return summary


def rollback(board_file: Path, group: str | None, to: str | None, batches: list[Batch], max_fail: int,
             console: Console, health_timeout: float = 180.0, quiet: bool = False) -> FleetSummary:
    start = time.monotonic()
    preflight(_warn(console))
    data = board_file_at(board_file).load()
    names = inv.select(data, group=group)
    with Fleet({n: data.boards[n] for n in names}) as fleet:  # the deploy locks, as `edgekit rollback` has none
        limit = list(fleet.targets)
        run = None
        if limit:
            extra: dict[str, Any] = {"edgekit_fleet": fleet_vars(health_timeout), "edgekit_serial": batches,
                                     "edgekit_max_fail": max_fail}
            if to:
                extra["edgekit_rollback_to"] = to
            run = run_playbook("rollback.yml", inv.render(data, limit), extra, limit,
                               forks=largest_batch(batches, len(limit)), on_line=_printer(console, quiet),
                               color=console.is_terminal, control=fleet.control, hold=fleet.lock_fds())
    summary = summarize("rollback", names, run.report if run else {}, fleet.failed)
    summary.seconds = round(time.monotonic() - start, 2)
    return summary


def status(board_file: Path, group: str | None, console: Console, quiet: bool = True) -> dict[str, Any]:
    """Per board: current/serving release, recipe, health (read-only; no locks)."""
    preflight(_warn(console))
    data = board_file_at(board_file).load()
    names = inv.select(data, group=group)
    if not names:
        return {"boards": {}}
    run = run_playbook("status.yml", inv.render(data, names), {"edgekit_fleet": fleet_vars(30.0)}, names,
                       forks=len(names), check=True, on_line=_printer(console, quiet), color=console.is_terminal)
    out: dict[str, Any] = {}
    for name in names:
        host = (run.report.get("hosts") or {}).get(name) or {}
        row = (host.get("data") or {}).get("edgekit")
        if row is not None and not (host.get("stats") or {}).get("failures"):
            out[name] = {"reachable": True, **row}
        else:
            fails = host.get("failures") or []
            why = host.get("unreachable") or (fails[-1]["msg"] if fails else "no answer")
            out[name] = {"reachable": False, "error": why}
    return {"boards": out, "seconds": run.seconds}
