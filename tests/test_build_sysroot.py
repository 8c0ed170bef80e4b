"""`edgekit build sysroot`: the board's CUDA target tree pulled over real SSH, symlinks kept."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from cli_helpers import edgekit


def fake_cuda(root: Path, version: str) -> None:
    """What JetPack's CUDA looks like under /usr/local: a versioned dir, a cuda symlink, targets/."""
    cuda = root / "usr/local" / f"cuda-{version.rsplit('.', 1)[0]}"
    target = cuda / "targets/aarch64-linux"
    (target / "include").mkdir(parents=True)
    (target / "lib").mkdir()
    (target / "include/cuda_runtime.h").write_text("/* board header */\n")
    (target / "lib/libcudart.so.12.6.68").write_bytes(b"\x7fELF board library")
    (target / "lib/libcudart.so.12").symlink_to("libcudart.so.12.6.68")
    link = root / "usr/local/cuda"
    if link.is_symlink() or link.is_file():
        link.unlink()
    elif link.is_dir():
        shutil.move(str(link / "version.json"), str(cuda / "version.json"))
        shutil.rmtree(link)
    link.symlink_to(cuda.name)


def test_sysroot_pulls_the_boards_cuda_tree(sim_boards, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("EDGEKIT_CACHE", str(tmp_path / "cache"))
    (board,) = sim_boards(1, fresh=True)
    res = edgekit("build", "sysroot", "--board", board.name, timeout=300)
    assert res.returncode == 2 and "no CUDA target tree" in res.stderr and "Traceback" not in res.stderr
    fake_cuda(board.root, "12.6.68")
    res = edgekit("--json", "build", "sysroot", "--board", board.name, timeout=300)
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    tree = Path(data["path"])
    assert data["cuda_version"].startswith("12.6") and data["files"] == 2
    assert (tree / "include/cuda_runtime.h").read_text() == "/* board header */\n"
    assert os.readlink(tree / "lib/libcudart.so.12") == "libcudart.so.12.6.68"
    # Without a CUDA 12 nvcc here no toolkit is assembled, and the note says why.
    from edgekit.build.cuda import host_nvcc, nvcc_version

    nvcc = host_nvcc()
    if nvcc is None or not nvcc_version(nvcc).startswith("12."):
        assert data["toolkit"] is None and "CUDA 12.6" in data["note"]


def test_sysroot_with_a_matching_nvcc_is_a_cross_toolkit(sim_boards, tmp_path: Path, monkeypatch) -> None:
    from edgekit.build.cuda import host_nvcc, nvcc_version

    nvcc = host_nvcc()
    if nvcc is None:
        pytest.skip("no host nvcc")
    monkeypatch.setenv("EDGEKIT_CACHE", str(tmp_path / "cache"))
    (board,) = sim_boards(1, "thor", fresh=True)
    version = json.loads((board.root / "usr/local/cuda/version.json").read_text())["cuda"]["version"]
    if version.split(".")[0] != nvcc_version(nvcc).split(".")[0]:
        pytest.skip(f"host nvcc {nvcc_version(nvcc)} and the Thor sim's CUDA {version} differ in major")
    fake_cuda(board.root, version)
    res = edgekit("--json", "build", "sysroot", "--board", board.name, timeout=300)
    assert res.returncode == 0, res.stderr
    toolkit = Path(json.loads(res.stdout)["toolkit"])
    assert (toolkit / "targets/aarch64-linux/include/cuda_runtime.h").read_text() == "/* board header */\n"
    assert (toolkit / "targets/aarch64-linux/lib/libcudart.so").is_symlink()
    out = subprocess.run([str(toolkit / "bin/nvcc"), "--version"], capture_output=True, text=True, check=False)
    assert out.returncode == 0 and "release" in out.stdout
