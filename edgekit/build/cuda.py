"""CUDA toolkits for Jetson builds, and the choice between them.

- Thor (JetPack 7, CUDA 13): cross from the workstation with the host's CUDA 13 nvcc plus an
  aarch64 target tree assembled from PyPI wheels (runtime, crt, cccl, cublas).
- Orin on JetPack 6 (CUDA 12.6): its driver cannot run CUDA 13 binaries and PyPI has no CUDA 12
  cross compiler, so a host CUDA 12.x toolkit with an aarch64 cross target is used when one is
  installed (NVIDIA's cuda-cross-aarch64 package), else the build runs on the board.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import stat
import subprocess
import tempfile
import zipfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from edgekit.build.downloads import pip_download
from edgekit.build.memo import remember
from edgekit.build.targets import Target, host_machine
from edgekit.errors import EdgekitError
from edgekit.paths import cache_dir
from edgekit.store import sha256_file

CROSS_TARGET_DIR = "aarch64-linux"
# Matched to the host nvcc 13.0 (PyPI's nvidia-cuda-nvcc 13.0.88); the tag must be given as is.
WHEEL_PLATFORMS = ("manylinux_2_27_aarch64", "manylinux2014_aarch64", "manylinux_2_17_aarch64")
CUDA13_AARCH64_WHEELS = (
    "nvidia-cuda-runtime==13.0.96",
    "nvidia-cuda-crt==13.0.88",
    "nvidia-cuda-cccl==13.0.85",
    "nvidia-cublas==13.1.1.3",
)
# The cuobjdump .ci/install puts beside the tests (find_cuobjdump takes it from site-packages); PyPI has no 13.0.
CUOBJDUMP_WHEEL = "nvidia-cuda-cuobjdump==13.2.78"
# Every wheel above by file name and sha256 (PyPI's, recorded when pinned): the aarch64 files pip picks for
# WHEEL_PLATFORMS and Python 3.11, and cuobjdump for both workstation machines. A file is checked against its
# pin after pip downloads it and before anything of it is unpacked (verify_wheel).
WHEEL_SHA256 = {
    "nvidia_cuda_runtime-13.0.96-py3-none-manylinux2014_aarch64.manylinux_2_17_aarch64.whl":
        "ef9bcbe90493a2b9d810e43d249adb3d02e98dd30200d86607d8d02687c43f55",
    "nvidia_cuda_crt-13.0.88-py3-none-manylinux2014_aarch64.manylinux_2_17_aarch64.whl":
        "ee2ea2a97073e02ee62bb27841f437332be2c248e3eac013df07997ada39c003",
    "nvidia_cuda_cccl-13.0.85-py3-none-manylinux2014_aarch64.manylinux_2_17_aarch64.whl":
        "6f0203e29fed809ee2b7fe9b1344df66ecab990c37d6a2e0e189b26d6c97ed7c",
    "nvidia_cublas-13.1.1.3-py3-none-manylinux_2_27_aarch64.whl":
        "b7a210458267ac818974c53038fbec2e969d5c99f305ab15c72522fa9f001dd5",
    "nvidia_cuda_cuobjdump-13.2.78-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl":
        "394087411405b846bf43aa52ca2ff603bbe18b3b8a1257cda0903e23c17bdbf3",
    "nvidia_cuda_cuobjdump-13.2.78-py3-none-manylinux2014_aarch64.manylinux_2_17_aarch64.whl":
        "c985f2ac62cc6b41cb3c612c4b8d117f4c30ff5c1a2f9e23ca3350e0090a85b6",
}
# Shared libraries a CUDA build of ggml needs at run time (JetPack provides them on the board).
CUDA_RUNTIME_LIBS = ("libcudart.so", "libcublas.so", "libcublasLt.so")


@dataclass(frozen=True)
class CudaToolkit:
    root: Path  # toolkit root: bin/nvcc and targets/<dir>/
    nvcc: Path
    version: str  # e.g. 13.0.88 ("" when not yet known, in a dry run)
    origin: str  # pypi-wheels | host-cross | board
    target_dir: str | None  # -target-dir for cross builds

    @property
    def major(self) -> int | None:
        return int(self.version.split(".")[0]) if self.version else None

    @property
    def lib_dir(self) -> Path:
        sub = f"targets/{self.target_dir}/lib" if self.target_dir else "lib64"
        return self.root / sub

    def to_dict(self) -> dict[str, object]:
        return {"root": str(self.root), "nvcc": str(self.nvcc), "version": self.version,
                "origin": self.origin, "target_dir": self.target_dir}


@dataclass(frozen=True)
class CudaChoice:
    """Where a CUDA build runs and with which toolkit, and why (said to the user)."""

    where: str  # workstation | board
    toolkit: CudaToolkit | None  # None when the board's own toolkit is used
    reason: str


def nvcc_version(nvcc: Path) -> str:
    def ask() -> str:
        proc = subprocess.run([str(nvcc), "--version"], capture_output=True, text=True, check=False)
        match = re.search(r"V(\d+\.\d+\.\d+)", proc.stdout)
        if proc.returncode != 0 or not match:
            raise EdgekitError(f"{nvcc} --version did not say its version.")
        return match.group(1)

    return remember("nvcc-version", nvcc, ask)


def host_nvcc() -> Path | None:
    """The workstation's nvcc: $CUDA_HOME, then PATH, then /usr/local/cuda (real path)."""
    candidates = [Path(os.environ["CUDA_HOME"]) / "bin" / "nvcc"] if os.environ.get("CUDA_HOME") else []
    found = shutil.which("nvcc")
    candidates += [Path(found)] if found else []
    candidates.append(Path("/usr/local/cuda/bin/nvcc"))
    for cand in candidates:
        real = _real_nvcc(cand)
        if real:
            return real
    return None


def _real_nvcc(path: Path) -> Path | None:
    """Follow symlinks and one-line `exec .../nvcc` wrapper scripts to the nvcc binary."""
    if not path.is_file():
        return None
    path = path.resolve()
    with open(path, "rb") as fh:
        head = fh.read(512)
    if head.startswith(b"#!"):
        match = re.search(rb"exec\s+(\S+/nvcc)\b", head)
        return _real_nvcc(Path(match.group(1).decode())) if match else None
    return path


def find_cross_toolkit(major: int) -> Path | None:
    """A host CUDA ``major``.x toolkit with an aarch64 cross target (e.g. /usr/local/cuda-12.6)."""
    env = os.environ.get(f"EDGEKIT_CUDA{major}_CROSS")
    candidates = [Path(env)] if env else []
    candidates += [Path(p) for p in sorted(glob.glob(f"/usr/local/cuda-{major}.*"), reverse=True)]
    for root in candidates:
        if (root / "bin" / "nvcc").is_file() and (root / "targets" / CROSS_TARGET_DIR / "include"
                                                   / "cuda_runtime.h").is_file():
            return root.resolve()
    return None


def wheel_tree_dir() -> Path:
    return cache_dir() / "toolchains" / "cuda13-aarch64"


def wheel_toolkit(dry_run: bool = False) -> CudaToolkit:
    """The CUDA 13 cross tree (host nvcc + aarch64 wheels), assembled in the cache once."""
    root = wheel_tree_dir()
    nvcc = root / "bin" / "nvcc"
    if dry_run:
        host = host_nvcc()  # the tree's nvcc is a link to the host one
        version = nvcc_version(nvcc) if nvcc.is_file() else nvcc_version(host) if host else ""
        return CudaToolkit(root, nvcc, version, "pypi-wheels", CROSS_TARGET_DIR)
    if not (root / ".complete").is_file():
        assemble_wheel_tree(root)
    return CudaToolkit(root, nvcc, nvcc_version(nvcc), "pypi-wheels", CROSS_TARGET_DIR)


def _link_or_copy(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def assemble_wheel_tree(root: Path, wheels_dir: Path | None = None) -> None:
    """Lay out a toolkit nvcc accepts with ``-target-dir aarch64-linux``.

    nvcc finds its includes relative to its own binary (nvcc.profile's $(_HERE_)), so the nvcc
    binary and profile are hard-linked (or copied) into the tree; the rest of bin/ and nvvm/ are
    symlinks to the host toolkit. The wheels' nvidia/cu13/{include,lib} become targets/sbsa-linux
    (Thor is SBSA), with targets/aarch64-linux pointing there and the unversioned .so links made.
    """
    nvcc = host_nvcc()
    if nvcc is None:
        raise EdgekitError("No CUDA nvcc on this machine; install CUDA 13 (PyPI nvidia-cuda-nvcc) or use --cpu-only.")
    if not nvcc_version(nvcc).startswith("13."):
        raise EdgekitError(f"{nvcc} is CUDA {nvcc_version(nvcc)}; the aarch64 wheel tree needs a CUDA 13 nvcc.")
    wheels_dir = wheels_dir or cache_dir() / "downloads" / "cuda-aarch64"
    extra = ["--only-binary", ":all:", "--python-version", "3.11"]
    for plat in WHEEL_PLATFORMS:
        extra += ["--platform", plat]
    pip_download(list(CUDA13_AARCH64_WHEELS), wheels_dir, extra)
    wheels = [_wheel_file(wheels_dir, req) for req in CUDA13_AARCH64_WHEELS]
    for wheel in wheels:  # every one checked before the tree is begun
        verify_wheel(wheel)

    def fill(sbsa: Path) -> None:
        for wheel in wheels:
            _unpack_wheel(wheel, sbsa)

    layout_cross_toolkit(root, nvcc, fill, "sbsa-linux",
                         "".join(f"{req} {wheel.name} sha256:{WHEEL_SHA256[wheel.name]}\n"
                                 for req, wheel in zip(CUDA13_AARCH64_WHEELS, wheels, strict=True)))


def layout_cross_toolkit(root: Path, nvcc: Path, fill: Callable[[Path], None], target_dir: str,
                         stamp: str) -> None:
    """Host nvcc + an aarch64 target tree that ``fill(dir)`` writes, laid out as one toolkit at ``root``.

    nvcc finds its includes relative to its own binary (nvcc.profile's $(_HERE_)), so the nvcc
    binary and profile are hard-linked (or copied) into the tree; the rest of bin/ and nvvm/ are
    symlinks to the host toolkit. The target tree lands in targets/<target_dir>, with
    targets/aarch64-linux pointing there and the unversioned .so links made.
    """
    host_root = nvcc.parent.parent
    root.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".cuda-", dir=root.parent))
    try:
        os.chmod(tmp, 0o755)  # mkdtemp makes it private; the tree is shared like any toolkit
        (tmp / "bin").mkdir()
        for item in sorted((host_root / "bin").iterdir()):
            if item.name in ("nvcc", "nvcc.profile"):
                _link_or_copy(item, tmp / "bin" / item.name)
            else:
                (tmp / "bin" / item.name).symlink_to(item)
        (tmp / "nvvm").symlink_to(host_root / "nvvm")
        target = tmp / "targets" / target_dir
        target.mkdir(parents=True)
        fill(target)
        (target / "lib").mkdir(exist_ok=True)
        (target / "include").mkdir(exist_ok=True)
        _make_so_links(target / "lib")
        # nvcc's own headers (fatbinary_section.h, nvPTXCompiler.h, ...) come with the host nvcc
        # and are the same for every target: link the ones the target tree lacks.
        for item in sorted((host_root / "include").iterdir()):
            if not (target / "include" / item.name).exists():
                (target / "include" / item.name).symlink_to(item)
        if target_dir != CROSS_TARGET_DIR:
            (tmp / "targets" / CROSS_TARGET_DIR).symlink_to(target_dir)
        (tmp / "include").symlink_to(f"targets/{CROSS_TARGET_DIR}/include")
        # Host-side libraries nvcc's own tools may load (its profile adds $(TOP)/lib).
        (tmp / "lib").symlink_to(host_root / "lib")
        (tmp / ".complete").write_text(stamp)
        if root.exists():
            shutil.rmtree(root)
        os.rename(tmp, root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _pinned_name(requirement: str, machine: str = "aarch64") -> str:
    """The file name WHEEL_SHA256 pins for ``requirement`` (``name==version``) on ``machine``."""
    name, version = requirement.split("==")
    prefix = f"{name.replace('-', '_')}-{version}-"
    found = [f for f in WHEEL_SHA256 if f.startswith(prefix) and f.endswith(f"_{machine}.whl")]
    if len(found) != 1:
        raise EdgekitError(f"edgekit pins no {machine} wheel of {requirement} by sha256, so it does not use one.")
    return found[0]


def _wheel_file(wheels_dir: Path, requirement: str) -> Path:
    """The pinned aarch64 wheel of ``requirement`` that pip downloaded into ``wheels_dir``."""
    name = _pinned_name(requirement)
    wheel = wheels_dir / name
    if not wheel.is_file():
        raise EdgekitError(f"pip did not download the pinned wheel of {requirement} ({name}) into {wheels_dir}.")
    return wheel


def verify_wheel(wheel: Path, pins: Mapping[str, str] = WHEEL_SHA256) -> None:
    """EdgekitError (one sentence) unless ``wheel``'s sha256 is the one ``pins`` records for its file name."""
    want = pins.get(wheel.name)
    if want is None:
        raise EdgekitError(f"The wheel {wheel.name} is not one edgekit pins by sha256; it is not used.")
    got = sha256_file(wheel)
    if got != want:
        raise EdgekitError(f"The wheel {wheel.name} has sha256 {got}, not the pinned {want}: it is not the file "
                           f"edgekit was pinned to, so it is not used (delete {wheel} to download it again).")


def _member_target(dest: Path, info: zipfile.ZipInfo) -> Path | None:
    """Where a member of a wheel would land under ``dest`` (None: a member edgekit does not unpack);
    EdgekitError for a member that is a symlink or whose path would leave ``dest``."""
    name = info.filename
    mode = info.external_attr >> 16
    if stat.S_ISLNK(mode):
        raise EdgekitError(f"member {name!r} is a symbolic link")
    parts = name.split("/")
    if name.startswith("/") or "\\" in name or re.match(r"[A-Za-z]:", name):  # C:… or C:\… on Windows
        raise EdgekitError(f"member {name!r} has an absolute or non-POSIX path")
    if ".." in parts:
        raise EdgekitError(f"member {name!r} climbs out with '..'")
    if len(parts) < 4 or parts[0] != "nvidia" or parts[2] not in ("include", "lib") or info.is_dir():
        return None
    out = dest.joinpath(*parts[2:])
    root = dest.resolve()
    if not out.resolve().is_relative_to(root):  # a symlink already under dest, e.g.
        raise EdgekitError(f"member {name!r} would land outside {dest}")
    return out


def _unpack_wheel(wheel: Path, dest: Path) -> None:
    """nvidia/cu13/{include,lib}/... → dest/{include,lib}/... (nothing else is needed).

    Every member is checked first: a wheel with one that is a symlink, has an absolute path or ``..``, or would
    land outside ``dest`` is refused (one sentence) with nothing of it written."""
    with zipfile.ZipFile(wheel) as zf:
        plan = []
        for info in zf.infolist():
            try:
                out = _member_target(dest, info)
            except EdgekitError as exc:
                raise EdgekitError(f"Refusing to unpack the wheel {wheel.name}: its {exc}.") from None
            if out is not None:
                plan.append((info, out))
        for info, out in plan:
            out.parent.mkdir(parents=True, exist_ok=True)
            with zf.open(info) as src, open(out, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)


def _make_so_links(lib: Path) -> None:
    """libfoo.so.13 → libfoo.so: the wheels ship only versioned names, linkers want the bare one."""
    for so in sorted(lib.glob("lib*.so.*")):
        bare = lib / (so.name.split(".so.")[0] + ".so")
        if not bare.exists():
            bare.symlink_to(so.name)


def choose_cuda(target: Target, on_board: bool = False, cuda_home: str | None = None,
                dry_run: bool = False) -> CudaChoice:
    """The toolkit for a CUDA build of ``target``, and the reason, in one sentence."""
    if on_board or host_machine() == target.machine:
        return CudaChoice("board", None, "building on the board with its own JetPack CUDA toolkit")
    if cuda_home == "pypi":
        toolkit = wheel_toolkit(dry_run)
        note = "" if (target.cuda_major or 13) >= 13 else (
            f"; these binaries need a CUDA 13 driver, which JetPack {target.jetpack} does not have")
        return CudaChoice("workstation", toolkit,
                          f"cross-compiling with the host CUDA 13 nvcc and PyPI's aarch64 CUDA 13 libraries "
                          f"(--cuda-home pypi){note}")
    if cuda_home:
        root = Path(cuda_home).expanduser().resolve()
        nvcc = root / "bin" / "nvcc"
        if not nvcc.is_file() or not (root / "targets" / CROSS_TARGET_DIR).is_dir():
            raise EdgekitError(f"--cuda-home {root} has no bin/nvcc with a targets/{CROSS_TARGET_DIR} tree.")
        version = nvcc_version(nvcc)
        return CudaChoice("workstation", CudaToolkit(root, nvcc, version, "host-cross", CROSS_TARGET_DIR),
                          f"cross-compiling with the CUDA {version} toolkit given by --cuda-home")
    major = target.cuda_major
    if major is None or major >= 13:
        toolkit = wheel_toolkit(dry_run)
        return CudaChoice("workstation", toolkit,
                          f"{target.name} runs CUDA {target.cuda_version} (JetPack {target.jetpack}): "
                          f"cross-compiling with the host CUDA {toolkit.version or '13'} nvcc and PyPI's aarch64 "
                          f"CUDA 13 libraries (a CUDA 13.x driver runs binaries of any 13.y toolkit with y ≤ x)")
    cross = find_cross_toolkit(major)
    if cross is not None:
        version = nvcc_version(cross / "bin" / "nvcc")
        return CudaChoice("workstation", CudaToolkit(cross, cross / "bin" / "nvcc", version, "host-cross",
                                                     CROSS_TARGET_DIR),
                          f"{target.name} runs CUDA {target.cuda_version} (JetPack {target.jetpack}), which "
                          f"cannot run CUDA 13 binaries: cross-compiling with the host CUDA {version} "
                          f"toolkit at {cross}")
    return CudaChoice("board", None,
                      f"{target.name} runs CUDA {target.cuda_version} (JetPack {target.jetpack}), which cannot "
                      f"run CUDA 13 binaries, PyPI has no CUDA {major} cross compiler and no host CUDA "
                      f"{major}.x toolkit with an aarch64 target is installed: building on the board")


def find_cuobjdump() -> Path | None:
    """cuobjdump from PATH, the host toolkit, or PyPI's nvidia-cuda-cuobjdump (nvidia/cu13/bin)."""
    found = shutil.which("cuobjdump")
    if found:
        return Path(found)
    nvcc = host_nvcc()
    if nvcc and (nvcc.parent / "cuobjdump").is_file():
        return nvcc.parent / "cuobjdump"
    try:
        import nvidia  # type: ignore[import-not-found]  # namespace package of the CUDA wheels
    except ImportError:
        return None
    for base in getattr(nvidia, "__path__", []):
        for cand in sorted(Path(base).glob("cu*/bin/cuobjdump")):
            return cand
    return None
