"""Checks after every build: right machine, right cubins, glibc the board has, and it runs."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from edgekit.build.cuda import find_cuobjdump
from edgekit.build.elf import cubin_archs, glibc_needed, is_elf, read_header
from edgekit.build.source import LLAMA_CPP_SHORT
from edgekit.build.targets import AARCH64_TRIPLE, Target, host_machine
from edgekit.errors import EdgekitError

VERSION_BINARY = "llama-cli"
_SM = re.compile(r"\.sm_(\d+)\.cubin")  # cuobjdump --list-elf: "ELF file 1: x.1.sm_87.cubin"


@dataclass
class Verification:
    machine: dict[str, str] = field(default_factory=dict)
    glibc_needed: str | None = None
    cubins: dict[str, dict[str, int]] = field(default_factory=dict)  # file → {"sm_87": n}
    cubin_tool: str | None = None
    version_output: str | None = None
    version_runner: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, object]:
        return dict(self.__dict__)


class VerifyError(EdgekitError):
    pass


def qemu_prefix(target: Target) -> list[str]:
    """How to run a target binary here: directly, or under qemu-user with the cross sysroot."""
    if target.machine == host_machine():
        return []
    qemu = shutil.which(f"qemu-{target.machine}") or shutil.which(f"qemu-{target.machine}-static")
    if qemu is None:
        return []
    return [qemu, "-L", f"/usr/{AARCH64_TRIPLE}"]


def cuobjdump_archs(tool: Path, path: Path) -> Counter[int]:
    proc = subprocess.run([str(tool), "--list-elf", str(path)], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        return Counter()
    return Counter(int(a) for a in _SM.findall(proc.stdout))


def check_machine(files: list[Path], target: Target, result: Verification) -> None:
    for path in files:
        if not is_elf(path):
            continue
        header = read_header(path)
        result.machine[path.name] = header.machine
        if header.machine != target.machine:
            raise VerifyError(f"{path.name} is built for {header.machine}, not {target.machine} ({target.slug}).")


def check_glibc(files: list[Path], target: Target, result: Verification) -> None:
    needed = max((v for p in files if is_elf(p) and (v := glibc_needed(p))), default=None)
    result.glibc_needed = f"{needed[0]}.{needed[1]}" if needed else None
    limit = target.glibc_max
    if needed and limit and needed > limit:
        raise VerifyError(f"The binaries need GLIBC {needed[0]}.{needed[1]}, newer than JetPack {target.jetpack}'s "
                          f"{limit[0]}.{limit[1]}.")


def check_cubins(files: list[Path], target: Target, result: Verification) -> None:
    """Every file with device code holds cubins for the profile's SM and for no other."""
    tool = find_cuobjdump()
    result.cubin_tool = str(tool) if tool else "edgekit.build.elf (fatbin reader)"
    for path in files:
        if not is_elf(path) or path.is_symlink():
            continue
        archs = cubin_archs(path)
        if tool and archs:
            archs = cuobjdump_archs(tool, path) or archs
        if archs:
            result.cubins[path.name] = {f"sm_{a}": n for a, n in sorted(archs.items())}
    if not target.cuda:
        return
    if not result.cubins:
        raise VerifyError(f"No CUDA device code (cubins) in the {target.slug} build.")
    want = f"sm_{target.cuda_arch}"
    for name, archs in result.cubins.items():
        if set(archs) != {want}:
            raise VerifyError(f"{name} holds cubins for {', '.join(archs)}, expected only {want}.")


def check_runs(bin_dir: Path, target: Target, result: Verification, lib_path: list[Path]) -> None:
    """`llama-cli --version` runs (under qemu for another CPU) and names the pinned commit."""
    prefix = qemu_prefix(target)
    if target.machine != host_machine() and not prefix:
        result.version_output = f"not run: no qemu-{target.machine} on this machine"
        return
    argv = [str(bin_dir / VERSION_BINARY), "--version"]
    env = None
    if lib_path:
        extra = ":".join(str(p) for p in lib_path)
        if prefix:
            prefix = [*prefix, "-E", f"LD_LIBRARY_PATH={extra}"]
        else:
            env = {"LD_LIBRARY_PATH": extra, "PATH": "/usr/bin:/bin"}
    result.version_runner = prefix
    try:
        proc = subprocess.run([*prefix, *argv], capture_output=True, text=True, timeout=120, env=env, check=False)
    except subprocess.TimeoutExpired:
        raise VerifyError(f"{VERSION_BINARY} --version did not finish in 120 s.") from None
    out = (proc.stdout + proc.stderr).strip()
    result.version_output = out[-500:]
    if proc.returncode != 0 or "version" not in out:
        last = out.splitlines()[-1] if out else "no output"
        raise VerifyError(f"{VERSION_BINARY} --version failed (exit {proc.returncode}): {last[:200]}")
    if LLAMA_CPP_SHORT not in out:
        result.version_output += f"\n(note: the pinned commit {LLAMA_CPP_SHORT} is not in the output)"


def verify(bin_dir: Path, target: Target, run: bool = True, lib_path: list[Path] | None = None) -> Verification:
    files = sorted(p for p in bin_dir.iterdir() if p.is_file() and not p.is_symlink())
    result = Verification()
    check_machine(files, target, result)
    check_glibc(files, target, result)
    check_cubins(files, target, result)
    if run:
        check_runs(bin_dir, target, result, lib_path or [])
    return result
