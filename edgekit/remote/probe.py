"""Board facts, read on the board: the one interface the rest of edgekit asks about a board.

The probe is edgekit/data/board/probe.sh (POSIX sh: it answers before edgekit knows whether the board has a
python3 for its agent), sent to ``sh -s`` on stdin. On a real Jetson the files are read from `/`; a simulated
board sets EDGEKIT_BOARD_ROOT (through sshd's SetEnv) and the very same script reads its board root instead.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from typing import Any

from edgekit.config.jetpack import L4T_RELEASES, line_for_l4t
from edgekit.remote import agent_ship
from edgekit.remote.runner import Runner
from edgekit.resources import data_path


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
    agents: list[str] = field(default_factory=list)  # edgekit agent zipapps under the base (remote.agent_ship)
    current: str | None = None  # the release `current` points at
    # edgekit's llama.cpp patches the current release's llama.cpp was built with ("name\tstate"); None where it
    # records none (not llama.cpp, or built before edgekit carried patches)
    llama_patches: list[str] | None = None

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
    agents: list[str] = []
    patches: list[str] | None = None
    for line in output.splitlines():
        key, sep, value = line.partition("=")
        if not sep:
            continue
        if key == "rail":
            chip, device, hwmon, channel, label = value.split(":", 4)
            rails.append(PowerRailInfo(chip, device, hwmon, int(channel), label.strip()))
        elif key == "agent":
            agents.append(value.strip())
        elif key == "llama_patches":  # the list file is there (it may list none)
            patches = patches or []
        elif key == "llama_patch":
            patches = [*(patches or []), value.strip()]
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
        agents=agents,
        current=values.get("current") or None,
        llama_patches=patches,
    )


def probe_script() -> bytes:
    return data_path("board", "probe.sh").read_bytes()


def probe(runner: Runner, base: str) -> BoardFacts:
    result = runner.run(["sh", "-s", "--", base], timeout=30, stdin=probe_script())
    facts = parse_probe(runner.name, result.stdout)
    if facts.base.startswith("/"):  # the probe was the stat: an agent it saw need not be looked for again
        runner.agents.update(f"{facts.base.rstrip('/')}/{agent_ship.DIR}/{name}" for name in facts.agents)
    return facts
