"""Helpers for the agent tests (no tests here): synthetic power trees, a scripted power writer,
and running the agent the way a board runs it (``python3 agent/edgekit_agent.py ...``)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
AGENT_DIR = REPO / "edgekit" / "agent"
AGENT = AGENT_DIR / "edgekit_agent.py"
TEGRASTATS_DATA = Path(__file__).resolve().parent / "data" / "tegrastats"


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)  # readers never see half a number


def _put(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def ina3221(root: Path, addr: str, labels: list[str], hwmon: int = 1) -> dict[str, tuple[Path, Path]]:
    """An INA3221 as L4T shows it; labels in channel order ("NC" allowed). label → (in, curr) files."""
    dev = root / "sys/bus/i2c/devices" / addr
    hw = dev / "hwmon" / f"hwmon{hwmon}"
    _put(dev / "name", "ina3221\n")
    _put(hw / "name", "ina3221\n")
    files = {}
    for k, label in enumerate(labels, start=1):
        _put(hw / f"in{k}_label", f"{label}\n")
        _put(hw / f"in{k}_input", "5000\n")
        _put(hw / f"curr{k}_input", "0\n")
        files[label] = (hw / f"in{k}_input", hw / f"curr{k}_input")
    _put(hw / "in7_label", "sum of shunt voltages\n")  # the chip's channel 7: not a rail
    _put(hw / "in7_input", "40\n")
    return files


def ina238(root: Path, addr: str = "2-0044", label: str = "VIN", hwmon: int = 2) -> Path:
    """Thor's INA238 (VIN, µW in power1_input); returns the power1_input file."""
    dev = root / "sys/bus/i2c/devices" / addr
    hw = dev / "hwmon" / f"hwmon{hwmon}"
    _put(dev / "name", "ina238\n")
    _put(hw / "name", "ina238\n")
    _put(hw / "in1_label", f"{label}\n")
    _put(hw / "in1_input", "19000\n")
    _put(hw / "curr1_input", "0\n")
    _put(hw / "power1_input", "0\n")
    return hw / "power1_input"


def set_ina3221(files: tuple[Path, Path], watts: float, mv: int = 5000) -> None:
    write_atomic(files[0], f"{mv}\n")
    write_atomic(files[1], f"{round(watts * 1e6 / mv)}\n")


def set_ina238(power_file: Path, watts: float) -> None:
    write_atomic(power_file, f"{round(watts * 1e6)}\n")


def thermal(root: Path, zones: dict[str, float]) -> None:
    for i, (kind, c) in enumerate(zones.items()):
        zone = root / f"sys/devices/virtual/thermal/thermal_zone{i}"
        _put(zone / "type", f"{kind}\n")
        _put(zone / "temp", f"{round(c * 1000)}\n")


# A step and a ramp with a known integral (watts against seconds since the trace's start).
STEP_AT, HOLD_UNTIL, RAMP_UNTIL = 0.5, 1.5, 3.0


def step_ramp(tau: float, low: float = 10.0, high: float = 20.0) -> float:
    if tau < STEP_AT:
        return low
    if tau < HOLD_UNTIL:
        return high
    if tau < RAMP_UNTIL:
        return high + (low - high) * (tau - HOLD_UNTIL) / (RAMP_UNTIL - HOLD_UNTIL)
    return low


def step_ramp_joules(a: float, b: float, low: float = 10.0, high: float = 20.0, n: int = 200_000) -> float:
    """∫ step_ramp over [a, b] by a fine midpoint sum (exact for this shape up to 1e-6 J)."""
    h = (b - a) / n
    return sum(step_ramp(a + (i + 0.5) * h, low, high) for i in range(n)) * h


class TraceWriter(threading.Thread):
    """Writes ``watts(τ)`` into sensor files every 5 ms (τ = monotonic − t0), like a live sensor."""

    def __init__(self, setters: list[Callable[[float], None]], t0: float, period: float = 0.005) -> None:
        super().__init__(daemon=True)
        self.setters, self.t0, self.period = setters, t0, period
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.is_set():
            tau = time.monotonic() - self.t0
            for setter in self.setters:
                setter(tau)
            self.halt.wait(self.period)

    def __enter__(self) -> TraceWriter:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.halt.set()
        self.join(timeout=5)


def agent_env(root: Path | None, path_prefix: Path | None = None) -> dict[str, str]:
    env = dict(os.environ)
    if root is None:
        env.pop("EDGEKIT_BOARD_ROOT", None)
    else:
        env["EDGEKIT_BOARD_ROOT"] = str(root)
    if path_prefix is not None:
        env["PATH"] = f"{path_prefix}{os.pathsep}{env.get('PATH', '')}"
    return env


def run_agent(args: list[str], root: Path | None, python: str = sys.executable, timeout: float = 60,
              path_prefix: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([python, str(AGENT), *args], env=agent_env(root, path_prefix), capture_output=True,
                          text=True, timeout=timeout, check=False)


def start_agent(args: list[str], root: Path | None, python: str = sys.executable,
                path_prefix: Path | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen([python, str(AGENT), *args], env=agent_env(root, path_prefix), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def stop_agent(proc: subprocess.Popen[str], sig: int = signal.SIGTERM) -> tuple[int, str, str]:
    """Signal the agent (it must stop cleanly); kill it only if it doesn't within 10 s."""
    if proc.poll() is None:
        proc.send_signal(sig)
    try:
        out, err = proc.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    return proc.returncode, out, err


def wait_for_samples(path: Path, until_t: float, proc: subprocess.Popen[str], timeout: float = 30) -> None:
    """Wait until the sample file has a sample at or after monotonic ``until_t``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"the agent ended early: {proc.communicate()}")
        if path.exists():
            lines = path.read_text().splitlines()
            for line in reversed(lines):
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                if "t" in rec and rec["t"] >= until_t:
                    return
                if "t" in rec:
                    break
        time.sleep(0.05)
    raise AssertionError(f"no sample after t={until_t} in {path} within {timeout} s")


def tegrastats_lines(name: str) -> list[str]:
    """The sample lines of tests/data/tegrastats/<name> (comment lines start with #)."""
    text = (TEGRASTATS_DATA / name).read_text()
    return [ln for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]
