"""Board facts, read on the board: the one interface the rest of edgekit asks about a board.

On a real Jetson the files are read from `/`; a simulated board sets EDGEKIT_BOARD_ROOT (through
sshd's SetEnv) and the very same script reads its board root instead.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from typing import Any

from edgekit.config.jetpack import L4T_RELEASES, line_for_l4t
from edgekit.remote.runner import Runner

# One round trip, POSIX sh only (nothing to install on a board). "$1" is the base directory.
PROBE_SH = r"""
root="${EDGEKIT_BOARD_ROOT:-}"
base="$1"
case "$base" in "~") base="$HOME" ;; "~/"*) base="$HOME/${base#\~/}" ;; esac
kv() { printf '%s=%s\n' "$1" "$2"; }
# The first line of a file into $line; builtins, not a process per file: every exec counts on a board
# that is probed on each deploy (and on simulated boards that share the workstation's cores).
first() { line=""; { IFS= read -r line; } 2>/dev/null < "$1"; }
first "$root/etc/nv_tegra_release"; kv l4t "$line"
model=""
for f in "$root/proc/device-tree/model" "$root/sys/firmware/devicetree/base/model"; do
  [ -r "$f" ] && { model="$(tr -d '\000' < "$f")"; break; }
done
kv model "$model"
kv cuda_json "$(tr -d '\n' 2>/dev/null < "$root/usr/local/cuda/version.json")"
un="$(uname -nrm)"  # node name, kernel release, machine: one process
kv arch "${un##* }"
kv glibc "$(getconf GNU_LIBC_VERSION 2>/dev/null)"
gpu=""  # the GPU's device node or CUDA driver library: Orin's nvgpu (JetPack 5/6), OpenRM's nvidia0 (Thor, JetPack 7)
for f in /dev/nvgpu/igpu0/ctrl /dev/nvhost-ctrl-gpu /dev/nvidia0 /usr/lib/aarch64-linux-gnu/nvidia/libcuda.so.1 \
         /usr/lib/aarch64-linux-gnu/tegra/libcuda.so.1; do
  [ -e "$root$f" ] && { gpu="$f"; break; }
done
kv gpu_driver "$gpu"
rest="${un#* }"
kv kernel "${rest% *}"
kv hostname "${un%% *}"
meminfo=/proc/meminfo; [ -r "$root/proc/meminfo" ] && meminfo="$root/proc/meminfo"
mem=""; avail=""; while read -r key value _; do
  case "$key" in MemTotal:) mem="$value" ;; MemAvailable:) avail="$value" ;; esac
done 2>/dev/null < "$meminfo"
kv mem_total_kb "$mem"
kv mem_available_kb "$avail"
d="$base"; while [ ! -d "$d" ] && [ "$d" != "/" ]; do d="$(dirname "$d")"; done
kv disk_free_kb "$(df -Pk "$d" 2>/dev/null | { read -r _; read -r _ _ _ avail _; printf '%s' "$avail"; })"
kv base "$base"
kv base_exists "$([ -d "$base" ] && echo 1 || echo 0)"
py="$(python3 -V 2>&1)"  # "Python 3.10.12": the version without starting the interpreter
case "$py" in "Python "[0-9]*) py="${py#Python }"; py="${py%%[!0-9.]*}" ;; *) py="" ;; esac
kv python "$py"
kv jtop_socket "$([ -S "$root/run/jtop.sock" ] && echo 1 || echo 0)"
kv jtop_bin "$(command -v jtop 2>/dev/null)"
kv tegrastats "$(command -v tegrastats 2>/dev/null)"
kv site_nginx "$(command -v nginx 2>/dev/null || { [ -x /usr/sbin/nginx ] && echo /usr/sbin/nginx; })"
kv site_aria2c "$(command -v aria2c 2>/dev/null)"
first "$root/var/lib/nvpmodel/status"; kv nvpmodel "$line"
kv user "$(id -un)"
# The helper `edgekit board setup --apply` installs is preferred to full sudo: edgekit then asks for no more.
helper="$root/usr/local/sbin/edgekit-root"
kv sudo "$( [ "$(id -u)" = 0 ] && echo root \
  || { [ -x "$helper" ] && sudo -n -l "$helper" >/dev/null 2>&1 && echo helper; } \
  || (sudo -n true 2>/dev/null && echo nopasswd || echo no) )"
kv helper "$helper"
kv helper_sha "$( [ -r "$helper" ] && { openssl dgst -sha256 -r "$helper" 2>/dev/null || sha256sum "$helper"; } \
  | cut -c1-64 )"
lib="$helper.d/unitspec.py"  # its renderer
kv helper_lib_sha "$( [ -r "$lib" ] && { openssl dgst -sha256 -r "$lib" 2>/dev/null || sha256sum "$lib"; } \
  | cut -c1-64 )"
kv groups "$(id -Gn)"
for dev in "$root"/sys/bus/i2c/devices/*; do
  [ -r "$dev/name" ] || continue
  first "$dev/name"; chip="$line"
  case "$chip" in ina3221|ina238|ina226) ;; *) continue ;; esac
  for hw in "$dev"/hwmon/hwmon*; do
    [ -d "$hw" ] || continue
    for lab in "$hw"/in*_label; do
      [ -r "$lab" ] || continue
      n="${lab##*/in}"; n="${n%_label}"
      first "$lab"; kv rail "$chip:${dev##*/}:${hw##*/}:$n:$line"
    done
    if [ "$chip" = ina238 ] && [ ! -e "$hw/in1_label" ] && [ -r "$hw/power1_input" ]; then
      kv rail "$chip:${dev##*/}:${hw##*/}:1:VIN"
    fi
  done
done
"""

@dataclass
class PowerRailInfo:
    chip: str
    device: str
    hwmon: str
    channel: int
    label: str


@dataclass
class BoardFacts:
    board: str
    model: str | None
    l4t: str | None
    jetpack: str | None
    cuda: str | None
    arch: str
    kernel: str
    hostname: str
    mem_total_mb: int | None
    disk_free_mb: int | None
    base: str
    base_exists: bool
    python: str | None
    jtop: bool
    tegrastats: bool
    nvpmodel: str | None
    user: str
    sudo: str  # root | helper (edgekit-root through sudo) | nopasswd (full sudo) | no
    power_rails: list[PowerRailInfo] = field(default_factory=list)
    glibc: str | None = None  # "2.35": the newest GLIBC_x.y a shipped binary may ask for
    gpu_driver: str | None = None  # a GPU device node or libcuda the board has (None: no GPU to use)
    # what the kernel says a new process can take without swapping (on a Jetson, CPU and GPU share it)
    mem_available_mb: int | None = None
    # a site's seed serves with nginx, its neighbours fetch with aria2c (edgekit.fleet.sites)
    site_tools: dict[str, bool] = field(default_factory=dict)
    helper: str = ""  # where edgekit-root is (or would be) on the board
    groups: list[str] = field(default_factory=list)  # the login user's: its servers run with them
    helper_sha: str = ""  # the installed helper's sha256 ("" when there is none)
    helper_lib_sha: str = ""  # and its renderer's (unitspec.py beside it)

    @property
    def is_jetson(self) -> bool:
        return self.l4t is not None

    @property
    def sudo_prefix(self) -> list[str]:
        """What goes before a command edgekit runs as root here (remote/privilege.py)."""
        if self.sudo == "root":
            return []
        return ["sudo", "-n", self.helper] if self.sudo == "helper" else ["sudo", "-n"]

    @property
    def service_user(self) -> str | None:
        """Who the release's units run as: the login user, unless it is root (then systemd's default, root)."""
        return None if self.sudo == "root" else self.user

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def parse_l4t(line: str) -> str | None:
    """'# R36 (release), REVISION: 4.3, ...' → '36.4.3'."""
    m = re.match(r"#\s*R(\d+)\s*\(release\),\s*REVISION:\s*([\d.]+)", line or "")
    return f"{m.group(1)}.{m.group(2)}" if m else None


def jetpack_for(l4t: str | None) -> str | None:
    """'36.4.3' → '6.2' (a release the table lists), else the line of its L4T major ('39.0.0' → '7.2')."""
    if not l4t:
        return None
    parts = l4t.split(".")
    for n in (3, 2):
        if ".".join(parts[:n]) in L4T_RELEASES:
            return L4T_RELEASES[".".join(parts[:n])]
    line = line_for_l4t(parts[0])
    return line.jetpack if line else None


def parse_cuda(raw: str) -> str | None:
    try:
        return json.loads(raw)["cuda"]["version"]
    except (ValueError, KeyError, TypeError):
        return None


def parse_glibc(raw: str) -> str | None:
    """'glibc 2.35' → '2.35'."""
    m = re.match(r"glibc\s+(\d+\.\d+)", raw.strip())
    return m.group(1) if m else None


def _int(value: str) -> int | None:
    return int(value) if value.strip().isdigit() else None


def parse_probe(board: str, output: str) -> BoardFacts:
    values: dict[str, str] = {}
    rails: list[PowerRailInfo] = []
    for line in output.splitlines():
        key, sep, value = line.partition("=")
        if not sep:
            continue
        if key == "rail":
            chip, device, hwmon, channel, label = value.split(":", 4)
            rails.append(PowerRailInfo(chip, device, hwmon, int(channel), label.strip()))
        else:
            values[key] = value.strip()
    l4t = parse_l4t(values.get("l4t", ""))
    mem_kb, disk_kb = _int(values.get("mem_total_kb", "")), _int(values.get("disk_free_kb", ""))
    return BoardFacts(
        board=board,
        model=values.get("model") or None,
        l4t=l4t,
        jetpack=jetpack_for(l4t),
        cuda=parse_cuda(values.get("cuda_json", "")),
        arch=values.get("arch", ""),
        kernel=values.get("kernel", ""),
        glibc=parse_glibc(values.get("glibc", "")),
        gpu_driver=values.get("gpu_driver") or None,
        hostname=values.get("hostname", ""),
        mem_total_mb=mem_kb // 1024 if mem_kb is not None else None,
        mem_available_mb=avail_kb // 1024 if (avail_kb := _int(values.get("mem_available_kb", ""))) is not None
        else None,
        disk_free_mb=disk_kb // 1024 if disk_kb is not None else None,
        base=values.get("base", ""),
        base_exists=values.get("base_exists") == "1",
        python=values.get("python") or None,
        jtop=values.get("jtop_socket") == "1",
        tegrastats=bool(values.get("tegrastats")),
        site_tools={"nginx": bool(values.get("site_nginx")), "aria2c": bool(values.get("site_aria2c"))},
        nvpmodel=values.get("nvpmodel") or None,
        user=values.get("user", ""),
        sudo=values.get("sudo", "no"),
        helper=values.get("helper", ""),
        groups=values.get("groups", "").split(),
        helper_sha=values.get("helper_sha", ""),
        helper_lib_sha=values.get("helper_lib_sha", ""),
        power_rails=rails,
    )


def probe(runner: Runner, base: str) -> BoardFacts:
    result = runner.run(["sh", "-c", PROBE_SH, "edgekit-probe", base], timeout=30)
    return parse_probe(runner.name, result.stdout)
