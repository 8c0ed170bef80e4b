"""`edgekit build sysroot --board B`: the board's own CUDA target tree, pulled over SSH.

JetPack 6 (Orin) runs CUDA 12.6 and PyPI has no CUDA 12 aarch64 libraries, so the headers and
libraries to cross-link against come from the board itself. With a host nvcc of the same CUDA
major, the pulled tree and that nvcc are laid out as one cross toolkit (the same layout as the
PyPI wheel tree), usable as `edgekit build --cuda-home <toolkit>`.
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import tarfile
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from edgekit.build.cuda import CROSS_TARGET_DIR, host_nvcc, layout_cross_toolkit, nvcc_version
from edgekit.build.untar import extract_all
from edgekit.errors import EdgekitError
from edgekit.paths import cache_dir
from edgekit.remote import agent_ship
from edgekit.remote.runner import LocalRunner, SshRunner


@dataclass
class Sysroot:
    board: str
    cuda_version: str
    path: Path  # the pulled target tree (include/, lib/)
    files: int
    bytes: int
    toolkit: Path | None  # host nvcc + this tree, when a host nvcc of the same major exists
    note: str

    def to_dict(self) -> dict[str, object]:
        data = asdict(self)
        data["path"], data["toolkit"] = str(self.path), str(self.toolkit) if self.toolkit else None
        return data


def sysroot_dir(board: str, cuda_version: str) -> Path:
    return cache_dir() / "toolchains" / f"sysroot-{board}-cuda{cuda_version}"


def _stream_tar(runner: SshRunner | LocalRunner, base: str, dest: Path) -> None:
    """The agent's `cuda-tree` on the board, its stdout unpacked as it arrives (no temp tarball on either side)."""
    argv = agent_ship.argv(agent_ship.ensure(runner, base), "cuda-tree")
    if isinstance(runner, LocalRunner):
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert proc.stdout is not None
        try:
            with tarfile.open(fileobj=proc.stdout, mode="r|") as tf:
                extract_all(tf, dest, "tar")
        except tarfile.ReadError:
            pass  # no tar at all: the verb failed; its exit status says why
        err = proc.stderr.read().decode() if proc.stderr else ""
        code = proc.wait()
    else:
        chan = runner.conn.transport.open_session()
        chan.exec_command(shlex.join(argv))
        try:
            with tarfile.open(fileobj=chan.makefile("rb"), mode="r|") as tf:
                extract_all(tf, dest, "tar")
        except tarfile.ReadError:
            pass  # no tar at all: the verb failed; its exit status says why
        code = chan.recv_exit_status()
        err = chan.makefile_stderr("rb").read().decode(errors="replace")
        chan.close()
    if code != 0:
        reason = err.strip().splitlines()[-1].removeprefix("error: ").rstrip(".") if err.strip() else f"exit {code}"
        raise EdgekitError(f"Board {runner.name!r} has no CUDA target tree to pull ({reason}); "
                           "install JetPack's CUDA toolkit there (nvidia-jetpack or cuda-toolkit-12-6).")


def pull_sysroot(runner: SshRunner | LocalRunner, base: str, board: str, cuda_version: str | None,
                 nvcc: Path | None = None) -> Sysroot:
    """The board's CUDA target tree into edgekit's cache (``base``: the board's edgekit directory, as probed, where
    its agent is)."""
    if not cuda_version:
        raise EdgekitError(f"Board {board!r} reports no CUDA version (/usr/local/cuda/version.json).")
    final = sysroot_dir(board, cuda_version)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".sysroot-", dir=final.parent))
    try:
        _stream_tar(runner, base, tmp)
        if final.exists():
            shutil.rmtree(final)
        tmp.rename(final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    entries = [p for p in final.rglob("*") if p.is_file() and not p.is_symlink()]
    size = sum(p.stat().st_size for p in entries)
    (final / ".edgekit-sysroot.json").write_text(json.dumps({"board": board, "cuda": cuda_version}) + "\n")
    toolkit, note = _toolkit(final, board, cuda_version, nvcc or host_nvcc())
    return Sysroot(board, cuda_version, final, len(entries), size, toolkit, note)


def _toolkit(tree: Path, board: str, cuda_version: str, nvcc: Path | None) -> tuple[Path | None, str]:
    """Lay out host nvcc + the pulled tree when their CUDA majors agree; else say what is missing."""
    major = cuda_version.split(".")[0]
    if nvcc is None:
        return None, (f"no host nvcc found: install a CUDA {major}.x toolkit for x86_64, then rerun to get a "
                      "cross toolkit from this sysroot")
    host = nvcc_version(nvcc)
    if host.split(".")[0] != major:
        return None, (f"the host nvcc is CUDA {host} but the board runs CUDA {cuda_version}: binaries must be "
                      f"built with a CUDA {major}.x nvcc (set EDGEKIT_CUDA{major}_CROSS or install one), or "
                      "use `edgekit build --on-board`")
    root = tree.parent / f"{tree.name}-toolkit"

    def fill(target: Path) -> None:
        shutil.copytree(tree / "include", target / "include", symlinks=True, dirs_exist_ok=True)
        if (tree / "lib").is_dir():
            shutil.copytree(tree / "lib", target / "lib", symlinks=True, dirs_exist_ok=True)

    layout_cross_toolkit(root, nvcc, fill, CROSS_TARGET_DIR, f"sysroot of {board}, CUDA {cuda_version}\n")
    return root, f"cross toolkit ready: edgekit build --board {board} --cuda-home {root}"
