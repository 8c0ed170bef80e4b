"""The agent sampler's CPU cost: % of one core while sampling at --hz (goal at 10 Hz: < 1 %).

Runs ``edgekit_agent.py sample`` as the board runs it and reads the sampler process's own CPU time
(utime + stime, /proc/<pid>/stat) after a warm-up and again --seconds later, so interpreter start-up
is not counted; the CPU time of start-up plus warm-up is reported beside it (``startup_cpu_s``).

    python3 benchmarks/sampler_cost.py                       # synthetic AGX Orin hwmon tree, 10 Hz, 20 s
    python3 benchmarks/sampler_cost.py --hz 20 --board thor  # Thor's INA238 tree
    python3 benchmarks/sampler_cost.py --board-root /        # on a Jetson: its real sensors (source auto)

Standard library only, so it runs on a board as well (with --agent pointing at the pushed agent).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_AGENT = os.path.join(os.path.dirname(HERE), "edgekit", "agent", "edgekit_agent.py")
CLK_TCK = os.sysconf("SC_CLK_TCK")


def _put(path: str, text: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as fh:
        fh.write(text)


def synthetic_tree(root: str, board: str) -> None:
    """The power monitors of an AGX Orin (two INA3221, one with NC channels) or a Thor (INA238 VIN)."""
    dev = os.path.join(root, "sys/bus/i2c/devices")
    if board == "thor":
        hw = os.path.join(dev, "2-0044/hwmon/hwmon2")
        _put(os.path.join(dev, "2-0044/name"), "ina238\n")
        for name, value in (("in1_label", "VIN"), ("in1_input", "19000"), ("curr1_input", "950"),
                            ("power1_input", "18050000")):
            _put(os.path.join(hw, name), value + "\n")
        return
    for addr, n, labels in (("1-0040", 1, ["VDD_GPU_SOC", "VDD_CPU_CV", "VIN_SYS_5V0"]),
                            ("1-0041", 2, ["NC", "VDDQ_VDD2_1V8AO", "NC"])):
        hw = os.path.join(dev, addr, "hwmon", f"hwmon{n}")
        _put(os.path.join(dev, addr, "name"), "ina3221\n")
        for k, label in enumerate(labels, start=1):
            _put(os.path.join(hw, f"in{k}_label"), label + "\n")
            _put(os.path.join(hw, f"in{k}_input"), "5000\n")
            _put(os.path.join(hw, f"curr{k}_input"), "480\n")


def tick_cpu_seconds(pid: int) -> float:
    """utime + stime: whole clock ticks, charged to whoever runs when the tick fires."""
    with open(f"/proc/{pid}/stat", "rb") as fh:
        fields = fh.read().rsplit(b")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def sched_cpu_seconds(pid: int) -> float | None:
    """Time on CPU to the nanosecond (the scheduler's own count), where the kernel exports it."""
    try:
        with open(f"/proc/{pid}/schedstat") as fh:
            return int(fh.read().split()[0]) / 1e9
    except (OSError, ValueError, IndexError):
        return None


def cpu_seconds(pid: int) -> tuple[float, str]:
    exact = sched_cpu_seconds(pid)
    return (exact, "schedstat") if exact is not None else (tick_cpu_seconds(pid), "utime+stime")


def measure(agent: str, root: str, hz: float, seconds: float, warmup: float, source: str) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "samples.jsonl")
        env = dict(os.environ)
        if root != "/":
            env["EDGEKIT_BOARD_ROOT"] = root
        argv = [sys.executable, agent, "sample", "--out", out, "--hz", str(hz), "--source", source,
                "--duration", str(warmup + seconds + 1.0)]
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            time.sleep(warmup)
            (c0, how), t0, w0 = cpu_seconds(proc.pid), tick_cpu_seconds(proc.pid), time.monotonic()
            time.sleep(seconds)
            (c1, _), t1, w1 = cpu_seconds(proc.pid), tick_cpu_seconds(proc.pid), time.monotonic()
            stdout, stderr = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.terminate()
                proc.communicate()
        if proc.returncode != 0:
            raise SystemExit(f"the sampler failed: {stderr.strip()}")
        summary = json.loads(stdout)
    return {
        "hz": hz,
        "source": summary.get("source"),
        "rails": summary.get("total_rail"),
        "seconds": round(w1 - w0, 3),
        "cpu_s": round(c1 - c0, 4),
        "cpu_measured_by": how,
        "startup_cpu_s": round(c0, 4),  # interpreter start, source discovery and the warm-up samples
        "cpu_percent_of_one_core": round(100.0 * (c1 - c0) / (w1 - w0), 3),
        "tick_cpu_percent_of_one_core": round(100.0 * (t1 - t0) / (w1 - w0), 3),
        "cpu_us_per_sample": round(1e6 * (c1 - c0) / ((w1 - w0) * hz), 1),
        "achieved_hz": summary.get("sampling_rate_hz"),
        "samples": summary.get("samples"),
        "clk_tck": CLK_TCK,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hz", type=float, nargs="+", default=[10.0, 20.0])
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--warmup", type=float, default=2.0)
    ap.add_argument("--board", choices=("orin", "thor"), default="orin", help="synthetic tree to sample")
    ap.add_argument("--board-root", default=None, help="sample this root instead (/ on a Jetson)")
    ap.add_argument("--source", default="hwmon", help="agent --source (default hwmon; auto on a board)")
    ap.add_argument("--agent", default=DEFAULT_AGENT)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        root = args.board_root
        if root is None:
            root = os.path.join(tmp, "root")
            synthetic_tree(root, args.board)
        for hz in args.hz:
            results.append(measure(args.agent, root, hz, args.seconds, args.warmup, args.source))
    report = {"board": args.board if args.board_root is None else args.board_root, "python": sys.version.split()[0],
              "results": results}
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        for r in results:
            print(f"{r['hz']:>5g} Hz ({r['source']}): {r['cpu_percent_of_one_core']:.3f} % of one core "
                  f"({r['cpu_s']} CPU-s over {r['seconds']} s by {r['cpu_measured_by']}, "
                  f"{r['cpu_us_per_sample']} µs/sample, achieved {r['achieved_hz']:.2f} Hz)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
