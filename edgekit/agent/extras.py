"""Board state worth recording next to power: clocks, temperatures, the nvpmodel mode.

Each reading is optional: what can't be read is left out (or None), never an error.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from typing import Any

from .fs import board_glob, board_path, glob_sorted, read_int, read_text

# GPU devfreq nodes: 17000000.gpu (Orin, L4T 36), 17000000.ga10b (Orin, L4T 35), gpu-gpc-0 (Thor).
_GPU_NAMES = ("gpu", "ga10b", "gv11b", "gp10b", "gb10b")
_MIN_VALID_C = -40.0  # Orin reports switched-off zones (CV0..2) as -256 °C


def cpu_mhz() -> dict[str, float]:
    out = {}
    for path in board_glob("/sys/devices/system/cpu/cpu[0-9]*/cpufreq/scaling_cur_freq"):
        khz = read_int(path)
        if khz is not None:
            out[path.split("/")[-3]] = round(khz / 1000.0, 1)
    return out


def gpu_mhz() -> dict[str, float]:
    out = {}
    for dev in board_glob("/sys/class/devfreq/*"):
        name = os.path.basename(dev)
        if not any(g in name.lower() for g in _GPU_NAMES):
            continue
        hz = read_int(os.path.join(dev, "cur_freq"))
        if hz is not None:
            out[name] = round(hz / 1e6, 1)
    return out


def throttle_points_c() -> dict[str, float]:
    """°C per thermal zone type at which the kernel starts to throttle: its lowest passive trip point."""
    out: dict[str, float] = {}
    for zone in board_glob("/sys/devices/virtual/thermal/thermal_zone*"):
        kind = read_text(os.path.join(zone, "type")) or os.path.basename(zone)
        for trip in glob_sorted(os.path.join(zone, "trip_point_*_type")):
            if (read_text(trip) or "").strip() != "passive":
                continue
            milli = read_int(trip[: -len("_type")] + "_temp")
            if milli is not None and milli > 0:
                out[kind] = min(out.get(kind, milli / 1000.0), milli / 1000.0)
    return out


def clock_caps_mhz() -> dict[str, float]:
    """The highest clock each CPU and the GPU may run at now (scaling_max_freq, devfreq max_freq): nvpmodel
    sets them, and thermal throttling lowers them."""
    out = {}
    for path in board_glob("/sys/devices/system/cpu/cpu[0-9]*/cpufreq/scaling_max_freq"):
        khz = read_int(path)
        if khz is not None:
            out[path.split("/")[-3]] = round(khz / 1000.0, 1)
    for dev in board_glob("/sys/class/devfreq/*"):
        name = os.path.basename(dev)
        hz = read_int(os.path.join(dev, "max_freq")) if any(g in name.lower() for g in _GPU_NAMES) else None
        if hz is not None:
            out[name] = round(hz / 1e6, 1)
    return out


def temperatures_c() -> dict[str, float]:
    """°C per thermal zone type (cpu-thermal, tj-thermal, ...), invalid readings left out."""
    out = {}
    for zone in board_glob("/sys/devices/virtual/thermal/thermal_zone*"):
        kind = read_text(os.path.join(zone, "type")) or os.path.basename(zone)
        milli = read_int(os.path.join(zone, "temp"))
        if milli is None:
            continue
        c = milli / 1000.0
        if c > _MIN_VALID_C:
            out[kind] = round(c, 3)
    return out


def hottest_c(zone: str | None = None) -> float | None:
    temps = temperatures_c()
    if zone is not None:
        return temps.get(zone)
    return max(temps.values()) if temps else None


def _mode_names() -> dict[int, str]:
    conf = read_text(board_path("/etc/nvpmodel.conf")) or ""
    return {int(i): n for i, n in re.findall(r"<\s*POWER_MODEL\s+ID=(\d+)\s+NAME=([^\s>]+)", conf)}


def nvpmodel() -> dict[str, Any] | None:
    """{"id", "name"} of the power mode: ``nvpmodel -q``, else /var/lib/nvpmodel/status + the conf."""
    exe = shutil.which("nvpmodel")
    if exe:
        try:
            res = subprocess.run([exe, "-q"], capture_output=True, text=True, timeout=10, check=False)
        except (OSError, subprocess.SubprocessError):
            res = None
        if res is not None and res.returncode == 0:
            name = re.search(r"NV Power Mode:\s*(\S+)", res.stdout)
            ids = [ln.strip() for ln in res.stdout.splitlines() if ln.strip().isdigit()]
            if name or ids:
                return {"id": int(ids[-1]) if ids else None, "name": name.group(1) if name else None,
                        "via": "nvpmodel -q"}
    status = read_text(board_path("/var/lib/nvpmodel/status"))
    m = re.search(r"pmode:(\d+)", status or "")
    if m:
        mode = int(m.group(1))
        return {"id": mode, "name": _mode_names().get(mode), "via": "/var/lib/nvpmodel/status"}
    return None


def clocks_locked() -> bool | None:
    """Whether the clocks are pinned at their top, as `jetson_clocks` leaves them: every CPU's scaling_min_freq
    equals its scaling_max_freq and every GPU's devfreq min_freq its max_freq. None when none can be read."""
    pairs = [(os.path.join(d, "scaling_min_freq"), os.path.join(d, "scaling_max_freq"))
             for d in board_glob("/sys/devices/system/cpu/cpu[0-9]*/cpufreq")]
    pairs += [(os.path.join(d, "min_freq"), os.path.join(d, "max_freq")) for d in board_glob("/sys/class/devfreq/*")
              if any(g in os.path.basename(d).lower() for g in _GPU_NAMES)]
    read = [(read_int(lo), read_int(hi)) for lo, hi in pairs]
    read = [(lo, hi) for lo, hi in read if lo is not None and hi is not None]
    return all(lo == hi for lo, hi in read) if read else None


def snapshot() -> dict[str, Any]:
    return {
        "t": time.monotonic(),
        "wall": time.time(),
        "cpu_mhz": cpu_mhz(),
        "gpu_mhz": gpu_mhz(),
        "temperatures_c": temperatures_c(),
        "nvpmodel": nvpmodel(),
        "nvpmodel_modes": {str(i): n for i, n in sorted(_mode_names().items())},  # what `nvpmodel -m` takes
        "clocks_locked": clocks_locked(),
    }


def wait_cool(below_c: float, timeout_s: float, zone: str | None = None, poll_s: float = 1.0) -> dict[str, Any]:
    """Wait until the hottest zone (or ``zone``) is below ``below_c``; says how it ended."""
    start = time.monotonic()
    first = hottest_c(zone)
    if first is None:
        return {"cooled": None, "reason": "no readable thermal zone" + (f" named {zone}" if zone else ""),
                "waited_s": 0.0}
    temp = first
    while True:
        if temp < below_c:
            return {"cooled": True, "temp_c": temp, "start_temp_c": first, "waited_s": time.monotonic() - start}
        if time.monotonic() - start >= timeout_s:
            return {"cooled": False, "temp_c": temp, "start_temp_c": first, "waited_s": time.monotonic() - start}
        time.sleep(min(poll_s, max(timeout_s - (time.monotonic() - start), 0.0)))
        now_c = hottest_c(zone)
        temp = temp if now_c is None else now_c
