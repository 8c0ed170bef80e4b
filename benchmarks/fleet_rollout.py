"""Wall time of `edgekit fleet rollout` to 1, 4 and 8 fresh simulated boards (goal: 8 ≤ 2× 1).

    python benchmarks/fleet_rollout.py                 # 1, 4, 8 boards, batch 100%, no canary, 3 repeats
    python benchmarks/fleet_rollout.py --sizes 1,2 --canary --repeat 1

Each size gets fresh boards (nothing in their stores; wiped again before each repeat, and the
median of the repeats is reported), so every rollout sends the whole release
(llama.cpp host build + the tiny Gemma 4 target and MTP drafter, ≈ 22 MB, 34 blobs) and starts
each board's service twice (candidate, then main). A second rollout of the same recipe ("again")
measures the no-change path; a third after stopping one board's service ("1 down") the path where
one board needs work and the rest are current. Every board is a simulated board on this machine, so the boards'
sshd, llama-server and Python share its cores with Ansible: fan-out is bounded by the cores here,
not by a network. The build and the models come from edgekit's cache (warm after the first size).

Prints JSON first, then a table. Needs the llama.cpp sdist (EDGEKIT_LLAMA_SRC or the cache).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import simenv  # benchmarks/simenv.py

from edgekit.config.boardfile import Boards
from edgekit.sim import boards as sim
from edgekit.sim import state as sim_state


def _children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def rollout(env: dict[str, str], group: str, canary: bool) -> tuple[float, dict[str, Any]]:
    argv = [sys.executable, "-m", "edgekit", "--json", "fleet", "rollout", "--recipe", "sim-tiny-mtp",
            "--group", group, "--batch", "100%"]
    if not canary:
        argv.append("--no-canary")
    start, cpu = time.monotonic(), _children_cpu()
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=1800, check=False)
    wall = time.monotonic() - start
    if proc.returncode != 0:
        failed = json.loads(proc.stdout).get("failed") if proc.stdout.strip() else None
        raise SystemExit(f"rollout to {group} failed (exit {proc.returncode}): {failed or proc.stderr[-3000:]}")
    report = json.loads(proc.stdout)
    report["controller_cpu_seconds"] = round(_children_cpu() - cpu, 2)  # edgekit + ansible-playbook + ssh clients
    return wall, report


def stop_service(sim_dir: Path, name: str) -> None:
    """Stop a board's service (its systemctl stand-in), as when its server died."""
    st = sim_state.load(sim_dir)
    assert st is not None
    board = st.boards[name]
    subprocess.run([sys.executable, str(board.bin_dir / "systemctl"), "stop", "edgekit-llama.service"],
                   env={**os.environ, "EDGEKIT_BOARD_ROOT": str(board.root)}, capture_output=True, check=True)


def wipe(sim_dir: Path, names: list[str]) -> None:
    """Make boards fresh again: service stopped (the board's own systemctl stand-in), releases, store, units gone."""
    st = sim_state.load(sim_dir)
    assert st is not None
    for name in names:
        board = st.boards[name]
        env = {**os.environ, "EDGEKIT_BOARD_ROOT": str(board.root)}
        for unit in ("edgekit-llama.service", "edgekit-llama-candidate.service"):
            subprocess.run([sys.executable, str(board.bin_dir / "systemctl"), "stop", unit], env=env,
                           capture_output=True, check=False)
        shutil.rmtree(board.base, ignore_errors=True)
        board.base.mkdir()
        for path in (board.root / "etc" / "systemd" / "system").rglob("edgekit-llama*"):
            path.unlink()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1,4,8", help="board counts (comma-separated)")
    ap.add_argument("--canary", action="store_true", help="first board as a canary (serial 1) before the batch")
    ap.add_argument("--repeat", type=int, default=3, help="rollouts per size (fresh boards each time); median")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    work, env, targets = simenv.isolated("edgekit-fleet-bench-")
    rows: list[dict[str, Any]] = []
    try:
        # Warm the build/convert caches and the help text once, outside the timings.
        sim.up(work / "sim", 1, "orin", targets)
        rollout(env, "sim-1", canary=False)
        for n in sizes:
            _, started, _ = sim.up(work / "sim", n, "orin", targets, add=True)
            boards = Boards(targets.board_file)
            data = boards.load()
            data.groups[f"bench{n}"] = started
            boards.save(data)
            runs = []
            for i in range(args.repeat):
                if i:
                    wipe(work / "sim", started)
                wall, report = rollout(env, f"bench{n}", args.canary)
                again, second = rollout(env, f"bench{n}", args.canary)
                assert len(report["succeeded"]) == n and not report["failed"], report
                assert not second["changed"], second["changed"]
                stop_service(work / "sim", started[-1])  # one board's server died: it alone needs work
                healed, third = rollout(env, f"bench{n}", args.canary)
                assert third["changed"] == [started[-1]] and not third["failed"], third
                runs.append((wall, report, again, healed))
            runs.sort(key=lambda r: r[0])
            wall, report = runs[len(runs) // 2][:2]
            per_task: dict[str, float] = {}
            for name, secs in report.get("task_seconds", []):
                per_task[name] = round(per_task.get(name, 0.0) + secs, 2)
            slowest = dict(sorted(per_task.items(), key=lambda kv: -kv[1]))
            rows.append({"boards": n, "seconds": round(wall, 2), "runs": [round(r[0], 2) for r in runs],
                         "ansible_seconds": report["ansible_seconds"],
                         "controller_cpu_seconds": report["controller_cpu_seconds"],
                         "again_seconds": round(statistics.median(r[2] for r in runs), 2),
                         "one_down_seconds": round(statistics.median(r[3] for r in runs), 2), "bytes_per_board": sum(
                             r["push"]["sent_bytes"] for r in report["succeeded"].values()) // n,
                         "slowest_tasks": slowest, "load_avg_1m": round(os.getloadavg()[0], 2)})
    finally:
        sim.down(work / "sim", purge=True)
        shutil.rmtree(work, ignore_errors=True)
    base = rows[0]["seconds"] if rows else 0.0
    for r in rows:
        r["ratio_vs_first"] = round(r["seconds"] / base, 2) if base else None
    result = {"benchmark": "fleet_rollout", "canary": args.canary, "batch": "100%", "cores": os.cpu_count(),
              "repeat": args.repeat,
              "rows": rows, "goal": "8 boards <= 2x 1 board"}
    print(json.dumps(result, indent=2))
    print(f"\n{'boards':>6} {'wall s':>8} {'ansible s':>10} {'x first':>8} {'again s':>8} {'1 down s':>9} "
          f"{'ctl cpu s':>10} {'MB/board':>9} {'load':>5}")
    for r in rows:
        print(f"{r['boards']:>6} {r['seconds']:>8.2f} {r['ansible_seconds']:>10.2f} {r['ratio_vs_first']:>8.2f} "
              f"{r['again_seconds']:>8.2f} {r['one_down_seconds']:>9.2f} {r['controller_cpu_seconds']:>10.2f} "
              f"{r['bytes_per_board'] / 1e6:>9.1f} "
              f"{r['load_avg_1m']:>5.1f}")


if __name__ == "__main__":
    main()
