"""Built-in Jetson board profiles: what a build, a deploy and a roofline need to know."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

from edgekit.config.jetpack import DEFAULT_LINES, JetPackLine, get_line
from edgekit.errors import EdgekitError


class PowerRail(BaseModel):
    """One channel of a board's power monitor, as jtop and the hwmon driver name it."""

    model_config = ConfigDict(frozen=True)
    label: str
    chip: Literal["ina3221", "ina238"]
    i2c_addr: str  # directory name under /sys/bus/i2c/devices, e.g. "1-0040"
    channel: int  # 1-based hwmon channel (in1/curr1 ...)
    idle_watts: float  # what the simulated board draws there at rest
    watts_per_busy_core: float  # what one fully busy core adds on that rail in the simulator


class BoardProfile(BaseModel):
    model_config = ConfigDict(frozen=True)

    name: str
    family: Literal["orin", "thor"]
    model: str  # device-tree model string of the developer kit
    cpu_arch: str  # GGML_CPU_ARM_ARCH / -march for the board's cores
    cpu_cores: int
    cuda_arch: int  # SM version: 87 (Orin, Ampere), 110 (Thor, Blackwell)
    # The JetPack line and its facts (config/jetpack.py): the family's default line unless with_jetpack says.
    jetpack: str
    l4t_major: int
    l4t_release: str  # what /etc/nv_tegra_release says on a current image
    cuda_version: str
    mem_gb: int
    mem_bandwidth_gbs: float
    total_power_rail: str
    power_rails: tuple[PowerRail, ...]

    @property
    def cuda_major(self) -> int:
        return int(self.cuda_version.split(".")[0])

    @property
    def mem_total_mb(self) -> int:
        """What the kernel's MemTotal says on a current image: the firmware's carve-outs are not in it."""
        return int(self.mem_gb * 1024 * 0.96)

    @property
    def mem_available_mb(self) -> int:
        """MemAvailable of a freshly booted board (desktop off): what a model server can have. The simulated
        board reports it; `edgekit recipes fit --board PROFILE` sizes recipes against it."""
        return int(self.mem_total_mb * 0.9)


def _ina3221(addr: str, labels: list[str], idle: list[float], per_core: list[float]) -> tuple[PowerRail, ...]:
    return tuple(
        PowerRail(label=label, chip="ina3221", i2c_addr=addr, channel=i + 1, idle_watts=w, watts_per_busy_core=c)
        for i, (label, w, c) in enumerate(zip(labels, idle, per_core, strict=True))
    )


_AGX_ORIN_RAILS = _ina3221(
    "1-0040", ["VDD_GPU_SOC", "VDD_CPU_CV", "VIN_SYS_5V0"], [2.4, 0.8, 3.5], [0.1, 0.9, 0.6]
)
_NX_RAILS = _ina3221("1-0040", ["VDD_IN", "VDD_CPU_GPU_CV", "VDD_SOC"], [4.6, 0.6, 1.3], [1.4, 0.9, 0.2])
_THOR_RAILS = (
    PowerRail(label="VIN", chip="ina238", i2c_addr="2-0044", channel=1, idle_watts=18.0, watts_per_busy_core=2.2),
)


def _line_fields(line: JetPackLine) -> dict[str, str | int]:
    """What a profile says about its JetPack line, from the table."""
    if line.l4t_release is None or line.cuda_version is None:
        raise EdgekitError(f"JetPack {line.jetpack} has no L4T release or CUDA in edgekit's table.")
    return {"jetpack": line.jetpack, "l4t_major": line.l4t_major, "l4t_release": line.l4t_release,
            "cuda_version": line.cuda_version}


_ORIN_COMMON = dict(
    family="orin",
    cpu_arch="armv8.2-a+dotprod+fp16",
    cuda_arch=87,
    **_line_fields(get_line(DEFAULT_LINES["orin"])),
)

PROFILES: dict[str, BoardProfile] = {
    p.name: p
    for p in [
        BoardProfile(
            name="orin-agx-64gb", model="NVIDIA Jetson AGX Orin Developer Kit", cpu_cores=12, mem_gb=64,
            mem_bandwidth_gbs=204.8, total_power_rail="VIN_SYS_5V0", power_rails=_AGX_ORIN_RAILS, **_ORIN_COMMON,
        ),
        BoardProfile(
            name="orin-agx-32gb", model="NVIDIA Jetson AGX Orin", cpu_cores=8, mem_gb=32,
            mem_bandwidth_gbs=204.8, total_power_rail="VIN_SYS_5V0", power_rails=_AGX_ORIN_RAILS, **_ORIN_COMMON,
        ),
        BoardProfile(
            name="orin-nx-16gb", model="NVIDIA Jetson Orin NX Engineering Reference Developer Kit", cpu_cores=8,
            mem_gb=16, mem_bandwidth_gbs=102.4, total_power_rail="VDD_IN", power_rails=_NX_RAILS, **_ORIN_COMMON,
        ),
        BoardProfile(
            name="orin-nx-8gb", model="NVIDIA Jetson Orin NX Engineering Reference Developer Kit", cpu_cores=6,
            mem_gb=8, mem_bandwidth_gbs=102.4, total_power_rail="VDD_IN", power_rails=_NX_RAILS, **_ORIN_COMMON,
        ),
        BoardProfile(
            name="orin-nano-8gb", model="NVIDIA Jetson Orin Nano Engineering Reference Developer Kit Super",
            cpu_cores=6, mem_gb=8, mem_bandwidth_gbs=102.0, total_power_rail="VDD_IN", power_rails=_NX_RAILS,
            **_ORIN_COMMON,
        ),
        BoardProfile(
            name="thor-agx-128gb", family="thor", model="NVIDIA Jetson AGX Thor Developer Kit",
            # Neoverse-V3AE is Armv9.2-A with SVE2, i8mm and bf16; gcc 12 knows armv9-a plus these.
            cpu_arch="armv9-a+fp16+i8mm+bf16", cpu_cores=14, cuda_arch=110, mem_gb=128, mem_bandwidth_gbs=273.0,
            total_power_rail="VIN", power_rails=_THOR_RAILS, **_line_fields(get_line(DEFAULT_LINES["thor"])),
        ),
    ]
}

ALIASES: dict[str, str] = {"orin": "orin-agx-64gb", "thor": "thor-agx-128gb"}


def profile_names() -> list[str]:
    return sorted(PROFILES) + sorted(ALIASES)


def get_profile(name: str) -> BoardProfile:
    key = ALIASES.get(name, name)
    try:
        return PROFILES[key]
    except KeyError:
        raise EdgekitError(
            f"Unknown board profile {name!r}; known profiles: {', '.join(profile_names())}."
        ) from None


def with_jetpack(profile: BoardProfile, jetpack: str | None) -> BoardProfile:
    """``profile`` as it is on JetPack line ``jetpack`` (None: the profile's own line)."""
    if jetpack is None or jetpack == profile.jetpack:
        return profile
    line = get_line(jetpack)  # the lines of config/jetpack.py a profile may be put on
    if profile.family not in line.families:
        raise EdgekitError(f"JetPack {jetpack} does not run on {profile.family.title()} "
                           f"(it runs on {', '.join(f.title() for f in line.families)}).")
    return profile.model_copy(update=_line_fields(line))
