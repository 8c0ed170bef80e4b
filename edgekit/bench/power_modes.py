"""`edgekit bench --power-modes 0,2 [--lock-clocks]`: the same bench at each nvpmodel mode, and the Pareto front.

Jetson owners pick a power mode (nvpmodel: MAXN, 50W, 30W, 15W on an AGX Orin) before anything else, and
published figures hold only at a stated mode with `jetson_clocks`. Each mode is set on the board (``nvpmodel -m``,
clocks pinned with ``jetson_clocks`` when asked), the full bench runs there (its own session: service stopped,
A B A B, put back), and the results are compared: tok/s, J/token and W per mode and point, and the points no
other beats on both speed and energy (the front).

The mode and clocks the board had are put back by the board itself: the agent's guard runs on the board for as
long as our SSH channel lives (as the deploy lock does) and restores them when the channel closes — at the end,
after an error or Ctrl-C, or when edgekit is killed and sshd closes the channel.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from edgekit.bench import boardfs, orchestrate
from edgekit.bench.orchestrate import BenchOptions
from edgekit.config.boardfile import Board
from edgekit.config.recipes import Recipe
from edgekit.errors import EdgekitError
from edgekit.remote import agent_ship, privilege
from edgekit.remote.channel_guard import ChannelGuard, guard_args
from edgekit.remote.probe import probe
from edgekit.remote.runner import LocalRunner, SshRunner, runner_for

Runner = SshRunner | LocalRunner
PYTHON = "python3"

def resolve(wanted: list[str], modes: dict[str, str], board: str) -> list[tuple[int, str]]:
    """"0,15W" → [(0, "MAXN"), (3, "15W")]: ids or names of the board's nvpmodel.conf, one sentence otherwise."""
    by_name = {n.lower(): int(i) for i, n in modes.items()}
    out = []
    for w in wanted:
        mode = int(w) if w.isdigit() and w in modes else by_name.get(w.lower())
        if mode is None:
            known = ", ".join(f"{i} ({n})" for i, n in modes.items()) or "none"
            raise EdgekitError(f"Board {board!r} has no power mode {w!r}; its nvpmodel modes: {known}.")
        if mode not in [m for m, _ in out]:
            out.append((mode, modes[str(mode)]))
    return out


def _guard(runner: Runner, root: str, sudo: Sequence[str], mode: int, clocks_file: str) -> ChannelGuard:
    """The agent's guard: when our channel closes, the board's mode (and its clocks, from the file jetson_clocks
    stored) put back by the board itself."""
    undo = [[*sudo, "nvpmodel", "-m", str(mode)]]
    if clocks_file:
        undo.append([*sudo, "jetson_clocks", "--restore", clocks_file])
    return ChannelGuard(runner, root, guard_args(undo=undo))


def _snapshot(runner: Runner, agent: str) -> dict[str, Any]:
    res = runner.run([PYTHON, agent, "snapshot", "--source", "none"], check=False, timeout=60)
    try:
        return json.loads(res.stdout)
    except ValueError:
        raise EdgekitError(f"Could not read board {runner.name!r}'s power mode: {res.stderr.strip()[-300:]}") from None


def _set(runner: Runner, sudo: Sequence[str], argv: list[str], what: str) -> None:
    res = runner.run([*sudo, *argv], check=False, timeout=120)
    if not res.ok:
        last = ((res.stderr or res.stdout).strip().splitlines() or [f"exit {res.exit_code}"])[-1]
        raise EdgekitError(f"Could not {what} on board {runner.name!r}: {last}")


@contextmanager
def modes_session(name: str, board: Board, say: Callable[[str], None],
                  lock_clocks: bool) -> Iterator[tuple[Callable[[int, str], dict[str, Any]], dict[str, str]]]:
    """Yields (set_mode(id, name) → the board's snapshot at that mode, the board's modes); puts everything back."""
    with runner_for(board, name) as runner:
        facts = probe(runner, board.base)
        sudo = facts.sudo_prefix
        work = f"{facts.base}/bench/modes-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"
        agent = agent_ship.ensure(runner, facts.base)
        try:
            before = _snapshot(runner, agent)
            modes = before.get("nvpmodel_modes") or {}
            current = (before.get("nvpmodel") or {}).get("id")
            if current is None or not modes:
                raise EdgekitError(f"Board {name!r} has no nvpmodel power modes to measure.")
            clocks_file = privilege.clocks_file(sudo, work) if lock_clocks else ""
            if lock_clocks:
                _set(runner, sudo, ["jetson_clocks", "--store", clocks_file], "store the clocks (jetson_clocks)")
            with _guard(runner, facts.base, sudo, int(current), clocks_file):
                def set_mode(mode: int, mode_name: str) -> dict[str, Any]:
                    say(f"power mode {mode} ({mode_name})" + (", clocks locked" if lock_clocks else ""))
                    _set(runner, sudo, ["nvpmodel", "-m", str(mode)], f"set power mode {mode} ({mode_name})")
                    if lock_clocks:
                        _set(runner, sudo, ["jetson_clocks"], "lock the clocks (jetson_clocks)")
                    snap = _snapshot(runner, agent)
                    if (snap.get("nvpmodel") or {}).get("id") != mode:
                        raise EdgekitError(f"Board {name!r} did not switch to power mode {mode} "
                                           f"(it reports {snap.get('nvpmodel')}).")
                    return snap

                yield set_mode, modes
            after = _snapshot(runner, agent)
            if (after.get("nvpmodel") or {}).get("id") != current:
                raise EdgekitError(f"Board {name!r} is at power mode {after.get('nvpmodel')}, not {current} as "
                                   "before: set it back with `sudo nvpmodel -m` there.")
            say(f"power mode {current} ({modes.get(str(current))}) restored"
                + (", clocks as they were" if lock_clocks else ""))
        finally:
            boardfs.remove_tree(runner, work)


def pareto(points: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each point marked ``front`` when no other is at least as fast and as frugal, and better in one."""
    def beats(a: dict[str, Any], b: dict[str, Any]) -> bool:
        return (a["tokens_per_second"] >= b["tokens_per_second"] and a["joules_per_token"] <= b["joules_per_token"]
                and (a["tokens_per_second"] > b["tokens_per_second"] or a["joules_per_token"] < b["joules_per_token"]))

    have = [p for p in points if p["tokens_per_second"] and p["joules_per_token"]]
    return [{**p, "front": p in have and not any(beats(q, p) for q in have if q is not p)} for p in points]


def _points(mode: int, mode_name: str, doc: dict[str, Any]) -> list[dict[str, Any]]:
    def mean(e: dict[str, Any] | None) -> float | None:
        return round(e["mean"], 6) if e else None

    return [{"mode": mode, "mode_name": mode_name, "config": p["config"], "concurrency": p["concurrency"],
             "context_length": p["context_length"], "temperature": p.get("temperature", 0.0),
             "tokens_per_second": mean(p["tokens_per_second"]),
             "joules_per_token": mean(p["joules_per_token"]), "average_watts": mean(p["average_watts"])}
            for p in doc["summary"]["points"]]


def measure_modes(name: str, board: Board, recipe: Recipe, opts: BenchOptions, wanted: list[str],
                  lock_clocks: bool, out_dir: Path, say: Callable[[str], None]) -> dict[str, Any]:
    """Every mode's bench in ``out_dir/<id>-<name>/``, then modes.json, modes.md and pareto.png beside them."""
    runs: list[dict[str, Any]] = []
    with modes_session(name, board, say, lock_clocks) as (set_mode, modes):
        chosen = resolve(wanted, modes, name)
        for mode, mode_name in chosen:
            snap = set_mode(mode, mode_name)
            doc = orchestrate.measure(name, board, recipe, replace(opts, out_dir=None), say)
            files = orchestrate.write(doc, out_dir / f"{mode}-{mode_name}", with_plots=opts.plots)
            runs.append({"mode": mode, "mode_name": mode_name, "clocks_locked": snap.get("clocks_locked"),
                         "cpu_mhz": snap.get("cpu_mhz"), "results": files["results"],
                         "headline": doc["summary"]["headline"]["text"], "points": _points(mode, mode_name, doc),
                         "power_available": bool(doc["power"].get("available"))})
    table = pareto([p for r in runs for p in r["points"]])
    doc = {"kind": "bench-power-modes", "board": name, "recipe": recipe.name, "lock_clocks": lock_clocks,
           "modes": [{k: v for k, v in r.items() if k != "points"} for r in runs], "table": table,
           "front": [p for p in table if p["front"]], "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    _write(doc, out_dir, opts.plots)
    return doc


def _write(doc: dict[str, Any], out_dir: Path, with_plots: bool) -> None:
    from edgekit.bench import plots

    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "modes.json").write_text(json.dumps(doc, indent=1) + "\n")

    def num(x: float | None, digits: int) -> str:
        return "–" if x is None else f"{x:.{digits}f}"

    clocks = " Clocks locked with jetson_clocks in every mode." if doc["lock_clocks"] else ""
    lines = [f"# {doc['recipe']} on {doc['board']}: power modes", "",
             "Each mode's full bench is in its own directory. **front**: no other mode and configuration is at "
             "least as fast and as frugal per token, and better in one." + clocks, "",
             "| mode | config | concurrency | tok/s | J/token | W | front |", "| --- " * 7 + "|"]
    lines += [f"| {p['mode']} ({p['mode_name']}) | {p['config']} | {p['concurrency']} | "
              f"{num(p['tokens_per_second'], 1)} | {num(p['joules_per_token'], 4)} | {num(p['average_watts'], 2)} | "
              f"{'**front**' if p['front'] else ''} |" for p in doc["table"]]
    (out_dir / "modes.md").write_text("\n".join(lines) + "\n")
    if with_plots and plots.available():
        plots.pareto(doc, out_dir / "pareto.png")


def keep_mode(name: str, board: Board, mode: int, mode_name: str, say: Callable[[str], None]) -> None:
    """Leave the board at ``mode`` (what `tune --power-modes` chose)."""
    with runner_for(board, name) as runner:
        sudo = probe(runner, board.base).sudo_prefix
        _set(runner, sudo, ["nvpmodel", "-m", str(mode)], f"set power mode {mode} ({mode_name})")
    say(f"power mode {mode} ({mode_name}) kept")
