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

The CPU of each rollout is reported in two parts: the controller's (edgekit, ansible-playbook and its
workers, the ssh clients and masters) and the simulated boards' (each board's sshd with every session process it
reaped — shells, tar, python3, the systemctl stand-in — and its services' supervisors and llama-servers),
which on a real fleet runs on the boards themselves. "per extra board" is what one more board adds to
each (wall, board CPU, controller CPU), against the first size. With the cores busy, 8 ≤ 2× 1 needs an
extra board to add at most a sixth of the one-board run's fixed part in wall time, i.e. at most a third of
it in CPU on these 2 cores — boards' and controller's together.

Prints JSON first, then a table. Needs the llama.cpp sdist (EDGEKIT_LLAMA_SRC or the cache).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
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

import psutil
import simenv  # benchmarks/simenv.py

from edgekit.config.boardfile import Boards
from edgekit.sim import boards as sim
from edgekit.sim import state as sim_state


def adopt_orphans(on: bool) -> None:
    """While a rollout runs, this process reaps its descendants' orphans (Linux): the SSH masters edgekit starts
    outlive the ssh process that forked them, and their CPU is the controller's. Not while `sim up` runs: the
    boards' sshds would be adopted too, and with them the services they start."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(36, int(on), 0, 0, 0)  # PR_SET_CHILD_SUBREAPER


def reap_orphans() -> None:
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass


def _children_cpu() -> float:
    reap_orphans()
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def rollout(env: dict[str, str], group: str, canary: bool) -> tuple[float, dict[str, Any]]:
    argv = [sys.executable, "-m", "edgekit", "--json", "fleet", "rollout", "--recipe", "sim-tiny-mtp",
            "--group", group, "--batch", "100%"]
    if not canary:
        argv.append("--no-canary")
    start, cpu = time.monotonic(), _children_cpu()
    adopt_orphans(True)
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=1800, check=False)
        wall = time.monotonic() - start
        time.sleep(0.2)  # the masters exit on edgekit's `ssh -O exit`; each board's sshd reaps its connection
        controller = _children_cpu() - cpu  # edgekit, ansible-playbook, the ssh clients and masters
    finally:
        adopt_orphans(False)
    if proc.returncode != 0:
        failed = json.loads(proc.stdout).get("failed") if proc.stdout.strip() else None
        raise SystemExit(f"rollout to {group} failed (exit {proc.returncode}): {failed or proc.stderr[-3000:]}")
    report = json.loads(proc.stdout)
    report["controller_cpu_seconds"] = round(controller, 2)
    return wall, report


def _tree_cpu(proc: psutil.Process) -> float:
    """CPU seconds of ``proc`` and of every child it has reaped."""
    t = proc.cpu_times()
    return t.user + t.system + t.children_user + t.children_system


def board_cpu(sim_dir: Path, names: list[str]) -> float:
    """CPU seconds the simulated boards ``names`` have used so far: each one's sshd with what it reaped (every
    session's processes), and its running services (the systemctl stand-in's supervisor, which reaps what it
    started, and the server it runs). A service that has ended took its CPU with it: take this where the
    boards' services were stopped before (wipe) and run after."""
    st = sim_state.load(sim_dir)
    assert st is not None
    total = 0.0
    for name in names:
        board = st.boards[name]
        with contextlib.suppress(psutil.Error):
            total += _tree_cpu(psutil.Process(board.sshd_pid))
        for proc in psutil.process_iter(["cmdline"]):
            argv = proc.info["cmdline"] or []
            if "__supervise" in argv and any(a.startswith(str(board.bin_dir)) for a in argv):
                with contextlib.suppress(psutil.Error):
                    total += _tree_cpu(proc) + sum(_tree_cpu(c) for c in proc.children(recursive=True))
    return total


def stop_service(sim_dir: Path, name: str) -> None:
    """Stop a board's service (its systemctl stand-in), as when its server died."""
    st = sim_state.load(sim_dir)
    assert st is not None
    board = st.boards[name]
    subprocess.run([sys.executable, str(board.bin_dir / "systemctl"), "stop", "edgekit-serve.service"],
                   env={**os.environ, "EDGEKIT_BOARD_ROOT": str(board.root)}, capture_output=True, check=True)


def wipe(sim_dir: Path, names: list[str]) -> None:
    """Make boards fresh again: service stopped (the board's own systemctl stand-in), releases, store, units gone."""
    st = sim_state.load(sim_dir)
    assert st is not None
    for name in names:
        board = st.boards[name]
        env = {**os.environ, "EDGEKIT_BOARD_ROOT": str(board.root)}
        for unit in ("edgekit-serve.service", "edgekit-serve-candidate.service"):
            subprocess.run([sys.executable, str(board.bin_dir / "systemctl"), "stop", unit], env=env,
                           capture_output=True, check=False)
        shutil.rmtree(board.base, ignore_errors=True)
        board.base.mkdir()
        for path in (board.root / "etc" / "systemd" / "system").rglob("edgekit-serve*"):
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
                before = board_cpu(work / "sim", started)
                wall, report = rollout(env, f"bench{n}", args.canary)
                report["board_cpu_seconds"] = round(board_cpu(work / "sim", started) - before, 2)
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
                         "board_cpu_seconds": report["board_cpu_seconds"],
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
        extra = r["boards"] - rows[0]["boards"]
        if extra > 0:
            r["per_extra_board"] = {k: round((r[key] - rows[0][key]) / extra, 3) for k, key in (
                ("wall_seconds", "seconds"), ("board_cpu_seconds", "board_cpu_seconds"),
                ("controller_cpu_seconds", "controller_cpu_seconds"))}
    result = {"benchmark": "fleet_rollout", "canary": args.canary, "batch": "100%", "cores": os.cpu_count(),
              "repeat": args.repeat,
              "rows": rows, "goal": "8 boards <= 2x 1 board"}
    print(json.dumps(result, indent=2))
    print(f"\n{'boards':>6} {'wall s':>8} {'ansible s':>10} {'x first':>8} {'again s':>8} {'1 down s':>9} "
          f"{'ctl cpu s':>10} {'board cpu s':>12} {'MB/board':>9} {'load':>5}")
    for r in rows:
        print(f"{r['boards']:>6} {r['seconds']:>8.2f} {r['ansible_seconds']:>10.2f} {r['ratio_vs_first']:>8.2f} "
              f"{r['again_seconds']:>8.2f} {r['one_down_seconds']:>9.2f} {r['controller_cpu_seconds']:>10.2f} "
              f"{r['board_cpu_seconds']:>12.2f} {r['bytes_per_board'] / 1e6:>9.1f} {r['load_avg_1m']:>5.1f}")
    for r in rows[1:]:
        e = r["per_extra_board"]
        print(f"per extra board ({rows[0]['boards']} -> {r['boards']}): wall {e['wall_seconds']:.3f} s, board CPU "
              f"{e['board_cpu_seconds']:.3f} s, controller CPU {e['controller_cpu_seconds']:.3f} s")


if __name__ == "__main__":
    main()
