"""Emulated aarch64 sim boards: a Jetson's binaries run under qemu-user, through the kernel's own exec.

`sim up --arch aarch64` starts the board's sshd behind `emulator.py`, in a user + mount namespace
whose binfmt_misc hands aarch64 ELF files to Debian's qemu-aarch64 (sysroot /usr/aarch64-linux-gnu).
Nothing in edgekit knows a board is emulated: the probe sees `uname -m` = aarch64 (a stand-in on
the board's PATH, like the other stand-ins), `deploy` builds and pushes the aarch64 release a Jetson
of that profile gets, and the board's systemctl starts its `llama-server` by path, as on a Jetson.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from functools import cache
from pathlib import Path

from edgekit.build.cuda import CROSS_TARGET_DIR, wheel_tree_dir
from edgekit.build.targets import AARCH64_TRIPLE, host_machine
from edgekit.errors import EdgekitError
from edgekit.sim.state import BoardState

EMULATED_ARCHES = ("aarch64",)
SYSROOT = Path("/usr") / AARCH64_TRIPLE
LAUNCHER = Path(__file__).with_name("emulator.py")

# `uname` and `arch` on an emulated board: the machine is the board's, the rest is the kernel's.
UNAME = """#!/bin/sh
# uname stand-in of an emulated aarch64 sim board (edgekit sim up --arch aarch64)
out=$(/usr/bin/uname "$@") || exit $?
printf '%s\\n' "$out" | sed 's/x86_64/aarch64/g'
"""
ARCH = """#!/bin/sh
echo aarch64
"""


def board_arch(arch: str | None) -> str | None:
    """What `--arch` means here: None for this machine's own architecture, else one we emulate."""
    if arch is None or arch == host_machine():
        return None
    if arch not in EMULATED_ARCHES:
        raise EdgekitError(f"Simulated boards can be {host_machine()} or emulated {', '.join(EMULATED_ARCHES)}, "
                           f"not {arch!r}.")
    return arch


def arch_of(board: BoardState) -> str:
    return board.arch or host_machine()


def find_qemu() -> str | None:
    return shutil.which("qemu-aarch64") or shutil.which("qemu-aarch64-static")


@cache
def check_available() -> str:
    """qemu-aarch64, the cross sysroot, and a kernel that gives user namespaces their own binfmt_misc;
    one sentence on what is missing. Returns the qemu path."""
    qemu = find_qemu()
    if qemu is None:
        raise EdgekitError("Emulated aarch64 boards need qemu-aarch64 (Debian: apt-get install qemu-user).")
    if not (SYSROOT / "lib" / "ld-linux-aarch64.so.1").exists():
        raise EdgekitError(f"Emulated aarch64 boards need the aarch64 sysroot {SYSROOT} "
                           "(Debian: apt-get install g++-aarch64-linux-gnu).")
    proc = subprocess.run([sys.executable, str(LAUNCHER), "--qemu", qemu, "--check"], capture_output=True,
                          text=True, timeout=30, check=False)
    if proc.returncode != 0:
        why = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1].removeprefix("emulator: ")
        raise EdgekitError(f"This machine cannot run emulated aarch64 boards: {why}.")
    return qemu


def launcher() -> list[str]:
    """The argv prefix that starts a board's sshd with aarch64 binaries running under qemu."""
    return [sys.executable, str(LAUNCHER), "--qemu", check_available(), "--"]


def cuda_lib_dir(root: Path) -> Path:
    return root / "usr/local/cuda/targets" / CROSS_TARGET_DIR / "lib"


def board_env(root: Path) -> dict[str, str]:
    """qemu-user's settings, for every session and service of the board: the sysroot's loader and
    libc, every CPU feature (the builds use armv8.2-a dotprod/fp16 and armv9-a i8mm/bf16), and the
    board's CUDA libraries on the guest's library path (JetPack's ld.so.conf.d/cuda.conf does that)."""
    return {"QEMU_LD_PREFIX": str(SYSROOT), "QEMU_CPU": "max",
            "QEMU_SET_ENV": f"LD_LIBRARY_PATH={cuda_lib_dir(root)}"}


def present_cuda(root: Path, cuda_version: str) -> None:
    """JetPack's CUDA runtime (libcudart, libcublas) on an emulated board of a CUDA 13 line: PyPI's
    aarch64 CUDA 13 libraries from edgekit's cross tree, so a CUDA build starts there as on a Jetson
    (and, finding no GPU driver, runs on the CPU). JetPack 6 boards run CUDA 12, which PyPI lacks."""
    if int(cuda_version.split(".")[0]) < 13:
        return
    lib = root / f"usr/local/cuda-{cuda_version}" / "targets" / CROSS_TARGET_DIR / "lib"
    if not lib.is_symlink():
        lib.parent.mkdir(parents=True, exist_ok=True)
        lib.symlink_to(wheel_tree_dir() / "targets" / CROSS_TARGET_DIR / "lib")  # filled by a CUDA build


def install_identity(bin_dir: Path) -> None:
    for name, text in (("uname", UNAME), ("arch", ARCH)):
        dest = bin_dir / name
        dest.write_text(text)
        dest.chmod(0o755)
