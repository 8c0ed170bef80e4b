"""The JetPack lines edgekit knows: one table of what each line's L4T, CUDA, Ubuntu and images are.

Every module that needs a fact about a JetPack line reads it here: board profiles (a profile's line and
what ``with_jetpack`` puts it on), the probe (L4T release → JetPack version), build targets (the newest
glibc a binary may need), and the simulated board's root (os-release, CUDA's version.json). What an
engine runs on a line (vLLM's container image) is the engine's own table, keyed by the line's name.

Orin runs JetPack 6 (R36, CUDA 12.6) or, since June 2026, JetPack 7.2 (R39, CUDA 13.2, SBSA packaging,
a full reflash); Thor runs JetPack 7 (R38, CUDA 13.0) or 7.2. JetPack 5 (R35) is known to the probe and
the glibc check, but no profile is put on it. Sources: NVIDIA's JetPack and Jetson Linux releases (JetPack 7.2
= Jetson Linux R39, Ubuntu 24.04, CUDA 13.2, June 2026), NVIDIA's CUDA compatibility table for Tegra (JetPack 6
runs CUDA 12.4–12.9 upgrade packages, never 13.x; JetPack 7.2 runs 13.2–13.4) and jetson-containers' L4T map
(L4T 36.x = JetPack 6.0–6.2.1, 38.x = 7.0–7.1, 39.x = 7.2).

This module is low in the layers: it imports nothing of edgekit but ``edgekit.errors``.
"""

from __future__ import annotations

from dataclasses import dataclass

from edgekit.errors import EdgekitError


@dataclass(frozen=True)
class JetPackLine:
    jetpack: str  # the line: "6", "7", "7.2"
    l4t_major: int  # Jetson Linux release: R36 → 36
    ubuntu: str  # the Ubuntu release as /etc/os-release says it: "22.04.5 LTS"
    ubuntu_codename: str  # "jammy"
    glibc: tuple[int, int]  # the newest GLIBC_x.y symbol version that Ubuntu provides
    python: str  # the Ubuntu's python3 (major.minor)
    releases: tuple[tuple[str, str], ...] = ()  # L4T release → JetPack version, for the releases boards run
    families: tuple[str, ...] = ()  # the board families a profile may be put on this line (none: known, not used)
    l4t_release: str | None = None  # first line of /etc/nv_tegra_release on a current image
    cuda_version: str | None = None  # major.minor: what a CUDA build for the line is pinned to
    cuda_patch: str | None = None  # the full version the line installs (usr/local/cuda/version.json)

    @property
    def cuda_major(self) -> int | None:
        return int(self.cuda_version.split(".")[0]) if self.cuda_version else None

    @property
    def major(self) -> str:
        """The JetPack major version: "7" for both "7" and "7.2"."""
        return self.jetpack.split(".")[0]


JETPACK_LINES: dict[str, JetPackLine] = {
    line.jetpack: line
    for line in [
        JetPackLine(
            jetpack="5", l4t_major=35, ubuntu="20.04.6 LTS", ubuntu_codename="focal", glibc=(2, 31), python="3.8",
            releases=(("35.4", "5.1.2"), ("35.5", "5.1.3"), ("35.6", "5.1.4")),
        ),
        JetPackLine(
            jetpack="6", l4t_major=36, ubuntu="22.04.5 LTS", ubuntu_codename="jammy", glibc=(2, 35), python="3.10",
            releases=(("36.2", "6.0 DP"), ("36.3", "6.0"), ("36.4.0", "6.1"), ("36.4.3", "6.2"),
                      ("36.4.4", "6.2.1")),
            families=("orin",),
            l4t_release="# R36 (release), REVISION: 4.3, GCID: 38968081, BOARD: generic, EABI: aarch64",
            cuda_version="12.6", cuda_patch="12.6.68",  # JetPack 6.2
        ),
        JetPackLine(
            jetpack="7", l4t_major=38, ubuntu="24.04.3 LTS", ubuntu_codename="noble", glibc=(2, 39), python="3.12",
            releases=(("38.2", "7.0"), ("38.3", "7.1")),
            families=("thor",),
            l4t_release="# R38 (release), REVISION: 2.0, GCID: 41844464, BOARD: generic, EABI: aarch64",
            cuda_version="13.0", cuda_patch="13.0.48",  # JetPack 7.0
        ),
        JetPackLine(
            # SBSA CUDA 13 on Orin too (like Thor); R39's releases are not listed: the L4T major names the line.
            jetpack="7.2", l4t_major=39, ubuntu="24.04.3 LTS", ubuntu_codename="noble", glibc=(2, 39), python="3.12",
            families=("orin", "thor"),
            l4t_release="# R39 (release), REVISION: 0.0, GCID: 43652233, BOARD: generic, EABI: aarch64",
            cuda_version="13.2", cuda_patch="13.2.51",
        ),
    ]
}

# The line a profile of each family runs unless its board says otherwise.
DEFAULT_LINES: dict[str, str] = {"orin": "6", "thor": "7"}

# L4T release ("36.4.3", or "38.2" for any 38.2.x) → JetPack version ("6.2").
L4T_RELEASES: dict[str, str] = {rel: jp for line in JETPACK_LINES.values() for rel, jp in line.releases}


def board_lines() -> dict[str, JetPackLine]:
    """The lines a profile may be put on (those with a board family, an L4T release and a CUDA)."""
    return {k: line for k, line in JETPACK_LINES.items() if line.families}


def get_line(jetpack: str) -> JetPackLine:
    """A line a profile may be put on, by its name ("6", "7", "7.2")."""
    lines = board_lines()
    try:
        return lines[jetpack]
    except KeyError:
        raise EdgekitError(f"Unknown JetPack line {jetpack!r}; known: {', '.join(lines)}.") from None


def default_line(family: str) -> JetPackLine:
    return get_line(DEFAULT_LINES[family])


def line_for_l4t(l4t_major: int | str) -> JetPackLine | None:
    """The line of an L4T major (36, or "36" as a release string starts)."""
    return next((line for line in JETPACK_LINES.values() if str(line.l4t_major) == str(l4t_major)), None)


def line_for_version(jetpack: str | None) -> JetPackLine | None:
    """The line a JetPack version belongs to: "6.2" → 6, "7.0" → 7, "7.2.1" → 7.2, "6.0 DP" → 6."""
    if not jetpack:
        return None
    found = [line for line in JETPACK_LINES.values()
             if jetpack == line.jetpack or jetpack.startswith(line.jetpack + ".")]
    return max(found, key=lambda line: len(line.jetpack), default=None)


def lines_of_major(major: str) -> list[JetPackLine]:
    """Every line of a JetPack major version ("7": 7 and 7.2), oldest first."""
    return [line for line in JETPACK_LINES.values() if line.major == major]


def cuda_patch(cuda_version: str) -> str | None:
    """The full CUDA version the line running ``cuda_version`` (major.minor) installs."""
    return next((line.cuda_patch for line in JETPACK_LINES.values() if line.cuda_version == cuda_version), None)
