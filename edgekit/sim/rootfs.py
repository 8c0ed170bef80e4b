"""A sim board's root: the files a Jetson shows under / (identity, CUDA, power tree, thermals).

Readers on a board take their root from $EDGEKIT_BOARD_ROOT (unset → "/" on a real Jetson), so
the same code reads both. The power tree has the hwmon layout jtop (jetson-stats 7.2) reads:

    sys/bus/i2c/devices/<addr>/name                     ina3221 | ina238
    sys/bus/i2c/devices/<addr>/hwmon/hwmonN/name
        in{k}_label  in{k}_input (mV)  curr{k}_input (mA)  curr{k}_max  curr{k}_crit (mA)
        curr{k}_max_alarm  curr{k}_crit_alarm               (INA3221)
        in1_input (mV)  curr1_input (mA)  power1_input (µW)  (INA238; in1_label too)

hwmonN numbers one chip each (1, 2, …); they differ between real boards, so readers glob.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from edgekit.config.jetpack import JETPACK_LINES, cuda_patch, line_for_l4t
from edgekit.config.profiles import BoardProfile, PowerRail

I2C_DEVICES = "sys/bus/i2c/devices"
THERMAL_DIR = "sys/devices/virtual/thermal"
THROTTLE_C = 95.0  # every simulated zone's passive trip point: past it the power updater lowers the CPU caps
THROTTLED_FRACTION = 0.6  # of the mode's CPU ceiling while throttled

# (zone type, share of the CPU-load temperature rise, idle °C); names as on L4T 36 / 38.
THERMAL_ZONES: dict[str, list[tuple[str, float, float]]] = {
    "orin": [
        ("cpu-thermal", 1.0, 41.0), ("gpu-thermal", 0.4, 39.5), ("cv0-thermal", 0.3, 39.0),
        ("cv1-thermal", 0.3, 39.0), ("cv2-thermal", 0.3, 39.2), ("soc0-thermal", 0.6, 40.0),
        ("soc1-thermal", 0.6, 39.8), ("soc2-thermal", 0.6, 39.9), ("tj-thermal", 1.0, 41.2),
    ],
    "thor": [
        ("cpu-thermal", 1.0, 43.0), ("gpu-thermal", 0.4, 41.0), ("soc012-thermal", 0.6, 42.0),
        ("soc345-thermal", 0.6, 41.5), ("tj-thermal", 1.0, 43.2),
    ],
}
CELSIUS_PER_BUSY_CORE = 2.5

_COMPATIBLE = {"orin": "nvidia,p3737-0000+p3701-0005\0nvidia,p3701-0005\0nvidia,tegra234\0",
               "thor": "nvidia,p3971-0000+p3834-0008\0nvidia,p3834-0008\0nvidia,tegra264\0"}
_CPU_MAX_KHZ = {"orin": 2201600, "thor": 2601000}
_GPU = {"orin": ("17000000.gpu", 1300500000), "thor": ("gpu-gpc-0", 1575000000)}


def nominal_mv(rail: PowerRail) -> int:
    """Bus voltage of a rail: the Orin module rails sit on 5 V, Thor's VIN on the 19 V input."""
    return 19000 if rail.chip == "ina238" else 5000


@dataclass(frozen=True)
class RailFiles:
    rail: PowerRail
    hwmon: Path

    @property
    def volt(self) -> Path:
        return self.hwmon / f"in{self.rail.channel}_input"

    @property
    def curr(self) -> Path:
        return self.hwmon / f"curr{self.rail.channel}_input"

    @property
    def power(self) -> Path | None:
        return self.hwmon / "power1_input" if self.rail.chip == "ina238" else None


def hwmon_dirs(root: Path, profile: BoardProfile) -> dict[str, Path]:
    """i2c address → its hwmonN directory (one per chip)."""
    addrs = sorted({r.i2c_addr for r in profile.power_rails})
    return {a: root / I2C_DEVICES / a / "hwmon" / f"hwmon{i}" for i, a in enumerate(addrs, start=1)}


def rail_files(root: Path, profile: BoardProfile) -> list[RailFiles]:
    dirs = hwmon_dirs(root, profile)
    return [RailFiles(r, dirs[r.i2c_addr]) for r in profile.power_rails]


def thermal_zones(root: Path, profile: BoardProfile) -> list[tuple[Path, float, float]]:
    """(temp file, share of the load rise, idle °C) per zone."""
    return [(root / THERMAL_DIR / f"thermal_zone{i}" / "temp", share, idle)
            for i, (_name, share, idle) in enumerate(THERMAL_ZONES[profile.family])]


def write_atomic(path: Path | str, text: str) -> None:
    """Readers never see half a number: write a hidden temp file, then rename over the target."""
    path = os.fspath(path)
    head, tail = os.path.split(path)
    tmp = os.path.join(head, f".{tail}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)
    os.replace(tmp, path)


def rail_values(rail: PowerRail, watts: float, volt_mv: int | None = None) -> dict[str, int]:
    """The numbers a chip reports for ``watts`` on a rail: mV, mA and (INA238) µW."""
    mv = volt_mv or nominal_mv(rail)
    ma = round(max(watts, 0.0) * 1e6 / mv)
    return {"mv": mv, "ma": ma, "uw": mv * ma}


def write_rail(files: RailFiles, watts: float, volt_mv: int | None = None) -> None:
    v = rail_values(files.rail, watts, volt_mv)
    write_atomic(files.volt, f"{v['mv']}\n")
    write_atomic(files.curr, f"{v['ma']}\n")
    if files.power is not None:
        write_atomic(files.power, f"{v['uw']}\n")


def _put(path: Path, text: str | bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)


def _link(path: Path, target: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.is_symlink():
        path.symlink_to(target)


def make_root(root: Path, profile: BoardProfile, volatile: Path | None = None) -> None:
    """Create the whole board root for ``profile`` (static files plus idle sensor values).

    With ``volatile`` (a tmpfs dir), ``root/sys`` is a symlink into it: the updater rewrites
    the sensor files 20× a second, and a rename over a file costs ~150 µs on ext4 (it flushes
    and discards blocks) but ~15 µs on tmpfs, where the real /sys lives in memory too.
    """
    fam = profile.family
    if volatile is not None:
        (volatile / "sys").mkdir(parents=True, exist_ok=True)
        root.mkdir(parents=True, exist_ok=True)
        _link(root / "sys", str(volatile / "sys"))
    # Identity: L4T release, OS, device tree, CUDA.
    _put(root / "etc/nv_tegra_release",
         f"{profile.l4t_release}, DATE: Mon Jan 13 22:13:09 UTC 2025\n# KERNEL_VARIANT: oot\n"
         "TARGET_USERSPACE_LIB_DIR=nvidia\nTARGET_USERSPACE_LIB_DIR_PATH=usr/lib/aarch64-linux-gnu/nvidia\n")
    # Ubuntu and CUDA as the profile's JetPack line installs them (config/jetpack.py); an L4T major the
    # table lacks gets JetPack 6's Ubuntu.
    line = line_for_l4t(profile.l4t_major) or JETPACK_LINES["6"]
    version, codename = line.ubuntu, line.ubuntu_codename
    _put(root / "etc/os-release",
         f'PRETTY_NAME="Ubuntu {version}"\nNAME="Ubuntu"\nVERSION_ID="{version.split()[0][:5]}"\n'
         f'VERSION="{version} ({codename.title()})"\nVERSION_CODENAME={codename}\nID=ubuntu\nID_LIKE=debian\n')
    dt = root / "sys/firmware/devicetree/base"
    _put(dt / "model", profile.model.encode() + b"\0")  # NUL-terminated, as the kernel exports it
    _put(dt / "compatible", _COMPATIBLE[fam].encode())
    _link(root / "proc/device-tree", "../sys/firmware/devicetree/base")
    cuda = cuda_patch(profile.cuda_version) or f"{profile.cuda_version}.0"
    _put(root / f"usr/local/cuda-{profile.cuda_version}/version.json", json.dumps(
        {"cuda": {"name": "CUDA SDK", "version": cuda},
         "cuda_cudart": {"name": "CUDA Runtime (cudart)", "version": cuda}}, indent=3) + "\n")
    _link(root / "usr/local/cuda", f"cuda-{profile.cuda_version}")
    # Memory as the board has it (the host's /proc/meminfo would say the workstation's).
    total_kb = profile.mem_total_mb * 1024
    _put(root / "proc/meminfo",
         f"MemTotal:       {total_kb} kB\nMemFree:        {int(total_kb * 0.85)} kB\n"
         f"MemAvailable:   {profile.mem_available_mb * 1024} kB\nSwapTotal:      {total_kb // 2} kB\n")
    # Power mode (nvpmodel -q reads these; see bin/nvpmodel).
    _put(root / "etc/nvpmodel.conf", _nvpmodel_conf(fam, profile.cpu_cores))
    _put(root / "var/lib/nvpmodel/status", "pmode:0000 fmode:quiet\n")
    _cpus_and_gpu(root, profile)
    _power_tree(root, profile)
    _thermal(root, profile)
    for d in ("etc/systemd/system", "run/systemd-sim", "var/log/journal-sim", "tmp"):
        (root / d).mkdir(parents=True, exist_ok=True)


# Power modes as the family's nvpmodel.conf names them, with each mode's CPU ceiling (kHz): the sim's nvpmodel
# caps the board's services at that fraction of the top one, and its power updater scales watts to match.
SIM_POWER_MODES = {"orin": (("MAXN", 2201600), ("50W", 1728000), ("30W", 1420800), ("15W", 1113600)),
                   "thor": (("MAXN", 2601000), ("120W", 2080800), ("90W", 1560600))}


def _nvpmodel_conf(family: str, cores: int) -> str:
    out = []
    for i, (name, khz) in enumerate(SIM_POWER_MODES[family]):
        out.append(f"< POWER_MODEL ID={i} NAME={name} >\n"
                   + "".join(f"CPU_ONLINE CORE_{c} 1\n" for c in range(cores))
                   + f"CPU_A78_0 MAX_FREQ {khz}\n")
    return "".join(out) + "< PM_CONFIG DEFAULT=0 >\n"


def set_cpu_caps(root: Path, fraction: float) -> None:
    """Every CPU's scaling_max_freq at ``fraction`` of its top clock (as a thermal cap or nvpmodel sets it)."""
    for freq in (root / "sys/devices/system/cpu").glob("cpu[0-9]*/cpufreq"):
        try:
            top = int((freq / "cpuinfo_max_freq").read_text())
        except (OSError, ValueError):
            continue
        write_atomic(freq / "scaling_max_freq", f"{int(top * fraction)}\n")


def mode_cpu_fraction(root: Path) -> float:
    """The board's current power mode's CPU ceiling over the top mode's (what bin/nvpmodel caps with)."""
    try:
        status = (root / "var/lib/nvpmodel/status").read_text()
        conf = (root / "etc/nvpmodel.conf").read_text()
    except OSError:
        return 1.0
    m = re.search(r"pmode:(\d+)", status)
    freqs = {int(i): int(f) for i, f in re.findall(r"<\s*POWER_MODEL\s+ID=(\d+)[^>]*>[^<]*?^CPU\S*\s+MAX_FREQ\s+(\d+)",
                                                   conf, re.M)}
    top = max(freqs.values(), default=0)
    mode = int(m.group(1)) if m else 0
    return freqs[mode] / top if top and mode in freqs else 1.0


def _cpus_and_gpu(root: Path, profile: BoardProfile) -> None:
    cpu = root / "sys/devices/system/cpu"
    span = f"0-{profile.cpu_cores - 1}\n"
    for name in ("online", "possible", "present"):
        _put(cpu / name, span)
    top = _CPU_MAX_KHZ[profile.family]
    for c in range(profile.cpu_cores):
        freq = cpu / f"cpu{c}/cpufreq"
        for name, value in (("cpuinfo_min_freq", 115200), ("cpuinfo_max_freq", top), ("scaling_min_freq", 729600),
                            ("scaling_max_freq", top), ("scaling_cur_freq", top)):
            _put(freq / name, f"{value}\n")
        _put(freq / "scaling_governor", "schedutil\n")
    node, hz = _GPU[profile.family]
    dev = root / f"sys/devices/platform/bus@0/{node}/devfreq/{node}"
    for name, value in (("cur_freq", hz), ("max_freq", hz), ("min_freq", 306000000)):
        _put(dev / name, f"{value}\n")
    _put(dev / "governor", "nvhost_podgov\n")
    _link(root / f"sys/class/devfreq/{node}", f"../../devices/platform/bus@0/{node}/devfreq/{node}")


def _power_tree(root: Path, profile: BoardProfile) -> None:
    dirs = hwmon_dirs(root, profile)
    chips = {r.i2c_addr: r.chip for r in profile.power_rails}
    for addr, hwmon in dirs.items():
        _put(hwmon.parent.parent / "name", f"{chips[addr]}\n")
        _put(hwmon / "name", f"{chips[addr]}\n")
        _link(root / "sys/class/hwmon" / hwmon.name, f"../../bus/i2c/devices/{addr}/hwmon/{hwmon.name}")
    for files in rail_files(root, profile):
        ch, rail = files.rail.channel, files.rail
        _put(files.hwmon / f"in{ch}_label", f"{rail.label}\n")
        if rail.chip == "ina3221":
            # Limits well above what the rail draws; alarms off.
            limit_ma = round((rail.idle_watts + rail.watts_per_busy_core * profile.cpu_cores) * 2e6 / 5000)
            for name, value in ((f"curr{ch}_max", limit_ma), (f"curr{ch}_crit", limit_ma * 2),
                                (f"curr{ch}_max_alarm", 0), (f"curr{ch}_crit_alarm", 0)):
                _put(files.hwmon / name, f"{value}\n")
        write_rail(files, rail.idle_watts)


def _thermal(root: Path, profile: BoardProfile) -> None:
    for i, (name, _share, idle) in enumerate(THERMAL_ZONES[profile.family]):
        zone = root / THERMAL_DIR / f"thermal_zone{i}"
        _put(zone / "type", f"{name}\n")
        _put(zone / "temp", f"{round(idle * 1000)}\n")
        for k, (kind, c) in enumerate((("passive", THROTTLE_C), ("critical", THROTTLE_C + 10))):
            _put(zone / f"trip_point_{k}_type", f"{kind}\n")
            _put(zone / f"trip_point_{k}_temp", f"{round(c * 1000)}\n")
        _link(root / f"sys/class/thermal/thermal_zone{i}", f"../../devices/virtual/thermal/thermal_zone{i}")


def read_power(root: Path) -> dict[str, float]:
    """Watts per rail label, found the way jtop finds them (name → hwmon → labels)."""
    out: dict[str, float] = {}
    devices = root / I2C_DEVICES
    for dev in sorted(devices.iterdir()) if devices.is_dir() else []:
        try:
            chip = (dev / "name").read_text().strip()
        except OSError:
            continue
        if chip not in ("ina3221", "ina238"):
            continue
        for hwmon in sorted((dev / "hwmon").glob("hwmon*")):
            for label in sorted(hwmon.glob("in*_label")):
                ch = label.name[2:].split("_")[0]
                try:
                    if chip == "ina238":
                        watts = int((hwmon / "power1_input").read_text()) / 1e6
                    else:
                        mv = int((hwmon / f"in{ch}_input").read_text())
                        ma = int((hwmon / f"curr{ch}_input").read_text())
                        watts = mv * ma / 1e6
                except (OSError, ValueError):
                    continue
                out[label.read_text().strip()] = watts
    return out
