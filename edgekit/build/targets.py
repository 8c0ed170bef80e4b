"""What a build is for: the host (simulated boards) or a Jetson profile, with or without CUDA."""

from __future__ import annotations

import platform
from dataclasses import dataclass

from edgekit.config.jetpack import line_for_version
from edgekit.config.profiles import BoardProfile, get_profile
from edgekit.errors import EdgekitError

TARGET_NAMES = ("host", "orin", "thor")
BINARIES = ("llama-server", "llama-cli", "llama-bench", "llama-quantize", "llama-perplexity")
AARCH64_TRIPLE = "aarch64-linux-gnu"


def host_machine() -> str:
    machine = platform.machine().lower()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(machine, machine)


@dataclass(frozen=True)
class Target:
    name: str  # host, or the profile's family (orin, thor)
    machine: str  # x86_64 | aarch64: what the ELF files must say
    profile: str | None = None
    cpu_arch: str | None = None  # GGML_CPU_ARM_ARCH
    cuda_arch: int | None = None  # None: CPU only
    cuda_version: str | None = None  # the CUDA the board runs (JetPack's)
    jetpack: str | None = None

    @property
    def cuda(self) -> bool:
        return self.cuda_arch is not None

    @property
    def cuda_major(self) -> int | None:
        return int(self.cuda_version.split(".")[0]) if self.cuda_version else None

    @property
    def slug(self) -> str:
        """Names build dirs and artifacts: host-cpu, orin-cpu, thor-cuda110."""
        return f"{self.name}-{f'cuda{self.cuda_arch}' if self.cuda else 'cpu'}"

    @property
    def glibc_max(self) -> tuple[int, int] | None:
        """Newest glibc symbol version the JetPack line's Ubuntu provides (config/jetpack.py)."""
        line = line_for_version(self.jetpack)
        return line.glibc if line else None

    def to_dict(self) -> dict[str, object]:
        return {"name": self.name, "slug": self.slug, "machine": self.machine, "profile": self.profile,
                "cpu_arch": self.cpu_arch, "cuda_arch": self.cuda_arch, "cuda_version": self.cuda_version,
                "jetpack": self.jetpack}


def host_target() -> Target:
    return Target(name="host", machine=host_machine())


def profile_target(profile: BoardProfile, cpu_only: bool = False, cuda_version: str | None = None,
                   jetpack: str | None = None) -> Target:
    """The build for ``profile``; ``cuda_version``/``jetpack`` as the board reports them (an Orin may run
    JetPack 6 with CUDA 12.6 or JetPack 7.2 with CUDA 13.2), else the profile's own line."""
    return Target(
        name=profile.family, machine="aarch64", profile=profile.name, cpu_arch=profile.cpu_arch,
        cuda_arch=None if cpu_only else profile.cuda_arch,
        # major.minor: what a CUDA build is pinned to (13.2.51 and 13.2.60 take the same binaries); a CPU
        # build does not depend on it.
        cuda_version=None if cpu_only else ".".join((cuda_version or profile.cuda_version).split(".")[:2]),
        jetpack=jetpack or profile.jetpack,
    )


def resolve_target(name: str, cpu_only: bool = False, cuda_version: str | None = None,
                   jetpack: str | None = None) -> Target:
    """`host`, a family alias (`orin`, `thor`) or any board profile name (on the board's JetPack line)."""
    if name == "host":
        return host_target()  # simulated boards: CPU only, whatever cpu_only says
    try:
        profile = get_profile(name)
    except EdgekitError:
        raise EdgekitError(f"Unknown build target {name!r}; use host, orin, thor or a board profile.") from None
    return profile_target(profile, cpu_only, cuda_version, jetpack)
