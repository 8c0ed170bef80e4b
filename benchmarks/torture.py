"""Torture: deploys of two releases, alternating, each hit by one fault at a random instant; after every round
the board must keep edgekit's invariants (edgekit.sim.faults.violations).

    python benchmarks/torture.py --rounds 100 --boards 2          # the figure in benchmarks/README.md
    python benchmarks/torture.py --rounds 12 --boards 1 --seed 7  # what tests/test_torture.py runs

Faults, each kind in turn (the order shuffled per cycle; the instant drawn from 5–100 % of the time a switch
between the two releases took on this machine before the rounds, ≈ 3–5 s for the tiny release, each round from a
slice of that window of its own, so the rounds cover the whole switch and no two hit the same instant):
- kill:  the deploying edgekit SIGKILLed;
- power: every process of the board killed at once (a power cut), with the deploying edgekit, then the board
         booted (`sim up` starts its enabled units, as systemd does);
- hang:  the board's server SIGSTOPped (alive, answering nothing); the deploy runs on, the board's watchdog
         (probing every second here) restarts it or the activation replaces it;
- cut:   the link reset (every board is reached through an edgekit.sim.link relay);
- stall: the link's open connections hang (new ones flow: a NAT that lost their state); the board file gives
         each board `stall_s: 6`, so edgekit gives a stalled connection up after ≈ 6 s;
- disk:  the board's disk filled (its base is a tmpfs of its own: root only, else this kind is left out),
         and freed once the deploy has ended.
After each round the board must, within 120 s: serve a release that passed its check, with `current`,
`serving` and the service unit agreeing, /health answering and every blob holding the bytes its name says.
At the end one more deploy per board must finish (the next deploy finishes the job).

Reports per fault kind: rounds, rounds with a violation, seconds from the fault to a board with none (mean and
max), and how the deploys ended. JSON first (also `--out DIR/torture.json`), then a Markdown table
(`torture.md`). Every board is a simulated board on this machine (benchmarks/simenv.py: a throwaway config).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import simenv  # benchmarks/simenv.py
import yaml
from rich.progress import Progress

from edgekit.resources import builtin_recipes_dir
from edgekit.sim import boards as sim
from edgekit.sim import faults
from edgekit.sim.link import Link, route
from edgekit.sim.testing import SimBoard

FAULTS = ("kill", "power", "hang", "cut", "stall", "disk")
DISK_MB = 384  # each board's tmpfs: both tiny releases with room to spare
# The board's watchdog probes every second: a hung server is noticed in seconds (the defaults take ≈ 45 s).
WATCHDOG = {"every_s": 1, "timeout_s": 1, "failures": 3, "start_grace_s": 5}


def recipe(work: Path, name: str) -> Path:
    data = yaml.safe_load((builtin_recipes_dir() / "sim-tiny-mtp.yaml").read_text())
    data["name"] = name
    data["runtime"]["watchdog"] = WATCHDOG
    path = work / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@dataclass
class Target:
    """A board under torture: the simulated board, its link, and its name in the board file (through the link)."""

    board: SimBoard
    link: Link
    name: str


def deploy_cmd(target: Target, path: Path) -> list[str]:
    # A server hung during the deploy's own check is waited for until the check's timeout, then the deploy goes
    # back to the old release: 30 s here (the tiny release starts in ≈ 1 s), not the default 180 s.
    return [sys.executable, "-m", "edgekit", "--json", "deploy", "--board", target.name, "--recipe", str(path),
            "--health-timeout", "30"]


def one_round(i: int, target: Target, fault: str, path: Path, env: dict[str, str], sim_dir: Path,
              targets: sim.Targets, n_boards: int, at: float) -> dict[str, Any]:
    board = target.board
    deploying = subprocess.Popen(deploy_cmd(target, path), env=env, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL)
    time.sleep(at)
    hit = time.monotonic()
    if fault == "kill":
        deploying.kill()
    elif fault == "power":
        sim.power_cut(sim_dir, board.name)
        deploying.kill()
        sim.up(sim_dir, n_boards, "orin", targets)  # boots it
    elif fault == "hang":
        faults.hang(board)
    elif fault == "cut":
        target.link.cut()
    elif fault == "stall":
        target.link.stall(existing_only=True)
    else:
        faults.fill_disk(board)
    try:
        rc = deploying.wait(300)
    except subprocess.TimeoutExpired:
        deploying.kill()
        rc = deploying.wait()
    faults.free_disk(board)
    took, wrong = faults.settle(board, limit=120)
    recovered = None if took is None else round(time.monotonic() - hit, 2)
    return {"round": i, "board": board.name, "fault": fault, "at_s": round(at, 3), "deploy_rc": rc,
            "recovered_s": recovered, "violations": wrong, "serving": faults.current(board)}


def summary(rounds: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for kind in FAULTS:
        mine = [r for r in rounds if r["fault"] == kind]
        if not mine:
            continue
        times = [r["recovered_s"] for r in mine if r["recovered_s"] is not None]
        rows.append({"fault": kind, "rounds": len(mine), "violations": sum(bool(r["violations"]) for r in mine),
                     "recovered_mean_s": round(statistics.mean(times), 2) if times else None,
                     "recovered_max_s": max(times) if times else None,
                     "deploy_ok": sum(r["deploy_rc"] == 0 for r in mine)})
    return rows


def markdown(doc: dict[str, Any]) -> str:
    lines = [f"# Torture: {doc['rounds']} rounds on {doc['boards']} board(s), seed {doc['seed']}", "",
             "| fault | rounds | rounds with a violation | fault → no violation, mean (max) | deploys that finished |",
             "| --- | --- | --- | --- | --- |"]
    for row in doc["summary"]:
        mean, top = row["recovered_mean_s"], row["recovered_max_s"]
        mean = "—" if mean is None else f"{mean:.1f} s ({top:.1f} s)"
        lines.append(f"| {row['fault']} | {row['rounds']} | {row['violations']} | {mean} | {row['deploy_ok']} |")
    lines += ["", f"Final deploys that finished: {doc['final_ok']} of {doc['boards']}.", ""]
    lines += [f"- final deploy to {name}: {why}" for name, why in doc["final_errors"].items()]
    bad = [r for r in doc["per_round"] if r["violations"]]
    lines += [f"- round {r['round']} ({r['fault']} at {r['at_s']} s): {'; '.join(r['violations'])}" for r in bad]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=100)
    ap.add_argument("--boards", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", type=Path, default=None, help="where torture.json and torture.md go")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    kinds_here = FAULTS if faults.can_mount() else tuple(k for k in FAULTS if k != "disk")
    work, env, targets = simenv.isolated("edgekit-torture-")
    sim_dir = work / "sim"
    with contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, work, ignore_errors=True)
        st, created, _ = sim.up(sim_dir, args.boards, "orin", targets)
        boards = [SimBoard.from_state(st, st.boards[n], targets.known_hosts) for n in created]
        for board in boards if "disk" in kinds_here else ():
            stack.enter_context(faults.small_disk(board, DISK_MB))
        stack.callback(sim.down, sim_dir)  # first of all at the end: then the disks are unmounted
        tortured = []
        for board in boards:
            link = stack.enter_context(Link(board.port))
            tortured.append(Target(board, link, route(targets.board_file, targets.known_hosts, board.name, link,
                                                      stall_s=6)))
        paths = [recipe(work, "torture-a"), recipe(work, "torture-b")]
        for target in tortured:
            subprocess.run(deploy_cmd(target, paths[0]), env=env, check=True, capture_output=True)
        # How long a switch takes here (blobs on the board, both releases made): faults fall within it.
        for path in (paths[1], paths[0]):
            t0 = time.monotonic()
            subprocess.run(deploy_cmd(tortured[0], path), env=env, check=True, capture_output=True)
            span = time.monotonic() - t0
        kinds: list[str] = []
        rounds = []
        # Stratified: round i's instant falls in slice slots[i] of the window. Independent draws over the whole
        # window left rounds at the same instant (12 rounds in ≈ 1.5 s at 10 ms steps: one time in three).
        slots = rng.sample(range(args.rounds), args.rounds)
        with Progress(transient=True) as progress:
            task = progress.add_task("torture", total=args.rounds)
            for i in range(args.rounds):
                if not kinds:
                    kinds = rng.sample(kinds_here, len(kinds_here))
                target = tortured[i % len(tortured)]
                path = paths[1 - (i // len(tortured)) % 2]  # each board alternates: b, a, b, …
                at = (0.05 + 0.95 * (slots[i] + rng.random()) / args.rounds) * span
                rounds.append(one_round(i, target, kinds.pop(), path, env, sim_dir, targets, args.boards, at))
                progress.update(task, advance=1, description=f"round {i + 1}: {rounds[-1]['fault']}")
        # The next deploy finishes the job — waiting, as a user would with --wait, for the deploy lock a session
        # lost to a stalled link still holds until the board's sshd ends it (≤ 20 s here; docs/deploy.md).
        finals = {t.board.name: subprocess.run([*deploy_cmd(t, paths[0]), "--wait", "60"], env=env,
                                               capture_output=True, text=True) for t in tortured}
        final_ok = sum(res.returncode == 0 for res in finals.values())
        final_errors = {name: (res.stderr.strip().splitlines() or [f"exit {res.returncode}"])[-1]
                        for name, res in finals.items() if res.returncode != 0}
    doc = {"rounds": args.rounds, "boards": args.boards, "seed": args.seed, "switch_s": round(span, 2),
           "summary": summary(rounds),
           "final_ok": final_ok, "final_errors": final_errors, "per_round": rounds}
    print(json.dumps(doc, indent=1))
    print(markdown(doc))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "torture.json").write_text(json.dumps(doc, indent=1))
        (args.out / "torture.md").write_text(markdown(doc))
    return 0 if final_ok == len(tortured) and not any(r["violations"] for r in rounds) else 1


if __name__ == "__main__":
    sys.exit(main())
