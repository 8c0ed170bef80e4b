"""Build planning without building: dry-run invocations, keys, CUDA choice, parsers."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
from click.testing import CliRunner

from edgekit.build import BuildOptions, build_key, prepare
from edgekit.build.cuda import choose_cuda
from edgekit.build.elf import cubin_archs, fatbin_entries, glibc_needed, read_header
from edgekit.build.progress import last_error, parse_progress
from edgekit.build.source import LLAMA_BUILD_NUMBER, LLAMA_CPP_SHORT, resolve_source
from edgekit.build.targets import resolve_target
from edgekit.cli import cli
from edgekit.errors import EdgekitError


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EDGEKIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("EDGEKIT_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.delenv("EDGEKIT_CUDA12_CROSS", raising=False)


def dry_run(*args: str) -> dict:
    result = CliRunner().invoke(cli, ["build", *args, "--dry-run", "--json"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def flags(data: dict) -> dict[str, str]:
    return dict(a[2:].split("=", 1) for a in data["configure"] if a.startswith("-D"))


def test_dry_run_thor_cross_cuda13() -> None:
    data = dry_run("--target", "thor")
    f = flags(data)
    assert data["where"] == "workstation"
    assert data["configure"][:2] == ["cmake", "-S"] and "Ninja" in data["configure"]
    assert f["GGML_NATIVE"] == "OFF" and f["LLAMA_OPENSSL"] == "OFF"
    assert f["LLAMA_USE_PREBUILT_UI"] == "OFF" and f["LLAMA_BUILD_TESTS"] == "OFF"
    assert f["LLAMA_BUILD_NUMBER"] == str(LLAMA_BUILD_NUMBER) and f["LLAMA_BUILD_COMMIT"] == LLAMA_CPP_SHORT
    assert f["CMAKE_INSTALL_RPATH"] == "$ORIGIN" and f["CMAKE_BUILD_WITH_INSTALL_RPATH"] == "ON"
    assert f["GGML_CPU_ARM_ARCH"] == "armv9-a+fp16+i8mm+bf16"
    assert f["GGML_CUDA"] == "ON" and f["CMAKE_CUDA_ARCHITECTURES"] == "110-real"
    assert f["GGML_CUDA_NO_VMM"] == "ON"
    assert f["CMAKE_CUDA_HOST_COMPILER"] == "aarch64-linux-gnu-g++"
    assert f["CMAKE_CUDA_FLAGS"] == "-target-dir aarch64-linux"
    # libggml-cuda.so needs libcudart/libcublas: executables link only with the target tree on -rpath-link.
    lib = f["CMAKE_CUDA_COMPILER"].removesuffix("bin/nvcc") + "targets/aarch64-linux/lib"
    assert f["CMAKE_EXE_LINKER_FLAGS"] == f["CMAKE_SHARED_LINKER_FLAGS"] == f"-Wl,-rpath-link,{lib}"
    assert f["CMAKE_CUDA_COMPILER"].endswith("toolchains/cuda13-aarch64/bin/nvcc")
    assert "set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)" in data["toolchain"]
    assert f["CMAKE_TOOLCHAIN_FILE"] == data["toolchain_file"]
    assert "-ccbin=aarch64-linux-gnu-g++" in data["nvcc"]
    assert "--generate-code=arch=compute_110,code=[sm_110]" in data["nvcc"]
    assert data["build"][-5:] == ["llama-server", "llama-cli", "llama-bench", "llama-quantize", "llama-perplexity"]
    assert data["cuda"]["origin"] == "pypi-wheels"
    assert "CUDA 13" in data["notes"][0]


def test_dry_run_orin_jetpack6_builds_on_board_and_says_why() -> None:
    data = dry_run("--target", "orin")
    f = flags(data)
    assert data["where"] == "board"
    assert "cannot run CUDA 13" in data["notes"][0] and "building on the board" in data["notes"][0]
    assert f["CMAKE_CUDA_ARCHITECTURES"] == "87-real" and f["GGML_CUDA_NO_VMM"] == "ON"
    assert f["GGML_CPU_ARM_ARCH"] == "armv8.2-a+dotprod+fp16"
    assert f["CMAKE_CUDA_COMPILER"] == "/usr/local/cuda/bin/nvcc"
    assert "CMAKE_TOOLCHAIN_FILE" not in f and "CMAKE_CUDA_HOST_COMPILER" not in f
    assert data["nvcc"][0] == "/usr/local/cuda/bin/nvcc"
    assert "--generate-code=arch=compute_87,code=[sm_87]" in data["nvcc"]
    assert data["build_dir"].startswith("~/edgekit/build/")


def test_orin_uses_a_host_cuda12_cross_toolkit_when_there(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "cuda-12.6"
    (root / "targets" / "aarch64-linux" / "include").mkdir(parents=True)
    (root / "targets" / "aarch64-linux" / "include" / "cuda_runtime.h").write_text("")
    (root / "bin").mkdir()
    nvcc = root / "bin" / "nvcc"
    nvcc.write_text("#!/bin/sh\necho 'Cuda compilation tools, release 12.6, V12.6.85'\n")
    nvcc.chmod(0o755)
    monkeypatch.setenv("EDGEKIT_CUDA12_CROSS", str(root))
    choice = choose_cuda(resolve_target("orin"), dry_run=True)
    assert choice.where == "workstation" and choice.toolkit is not None
    assert choice.toolkit.version == "12.6.85" and "host CUDA 12.6.85" in choice.reason


def test_cpu_only_cross_and_host() -> None:
    thor = flags(dry_run("--target", "thor", "--cpu-only"))
    assert "GGML_CUDA" not in thor and thor["GGML_CPU_ARM_ARCH"].startswith("armv9-a")
    host = dry_run("--target", "host")
    assert host["target"]["machine"] == "x86_64" and "GGML_CPU_ARM_ARCH" not in flags(host)
    assert host["toolchain"] is None


def test_key_changes_with_flags_not_with_cache_location(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    key = build_key(prepare(BuildOptions(target="thor", cpu_only=True), dry_run=True))
    assert key == build_key(prepare(BuildOptions(target="thor", cpu_only=True), dry_run=True))
    assert key != build_key(prepare(BuildOptions(target="orin", cpu_only=True), dry_run=True))
    monkeypatch.setenv("EDGEKIT_CACHE", str(tmp_path / "elsewhere"))
    assert key == build_key(prepare(BuildOptions(target="thor", cpu_only=True), dry_run=True))


def test_user_errors_are_one_sentence() -> None:
    runner = CliRunner()
    res = runner.invoke(cli, ["build", "--target", "orin"])
    assert res.exit_code != 0 and "give --board NAME" in str(res.exception)
    with pytest.raises(EdgekitError, match="does not exist"):
        resolve_source("/nonexistent/llama.cpp")
    with pytest.raises(EdgekitError, match="Unknown build target"):
        resolve_target("xavier")


def test_elf_header_and_glibc_of_a_system_binary() -> None:
    header = read_header(Path("/bin/ls"))
    assert header.machine == "x86_64" and header.bits == 64
    assert glibc_needed(Path("/bin/ls")) >= (2, 3)
    assert cubin_archs(Path("/bin/ls")) == {}


def test_fatbin_reader_counts_cubins_per_arch() -> None:
    def entry(kind: int, arch: int, payload: bytes) -> bytes:
        head = struct.pack("<HHIQ", kind, 0x101, 0x40, len(payload)) + b"\0" * 12 + struct.pack("<I", arch)
        return head.ljust(0x40, b"\0") + payload
    body = entry(2, 87, b"x" * 24) + entry(1, 87, b"p" * 8) + entry(2, 110, b"y" * 16)
    fatbin = struct.pack("<IHHQ", 0xBA55ED50, 1, 16, len(body)) + body
    entries = fatbin_entries(fatbin + b"\0" * 8 + fatbin)
    assert entries.count(("cubin", 87)) == 2 and entries.count(("ptx", 87)) == 2
    assert entries.count(("cubin", 110)) == 2


def test_progress_and_error_extraction() -> None:
    assert parse_progress("[12/345] Building CXX object src/CMakeFiles/llama.dir/llama.cpp.o") == (
        12, 345, "Building CXX object src/CMakeFiles/llama.dir/llama.cpp.o")
    assert parse_progress("-- Configuring done") is None
    log = "\n".join(
        [f"[{i}/900] Building CXX object x{i}.o" for i in range(1, 400)]
        + ["FAILED: ggml/src/CMakeFiles/ggml-cpu.dir/ops.cpp.o",
           "/usr/bin/c++ -O3 ... -c ops.cpp",
           "\x1b[01m\x1b[Kops.cpp:12:5:\x1b[m\x1b[K \x1b[01;31m\x1b[Kerror: \x1b[m\x1b[K'foo' was not declared",
           "   12 |     foo();", "      |     ^~~",
           "ninja: build stopped: subcommand failed."]
        + ["warning: noise"] * 5000
    )
    err = last_error(log)
    assert err.splitlines()[0] == "in ggml/src/CMakeFiles/ggml-cpu.dir/ops.cpp.o"
    assert "ops.cpp:12:5: error: 'foo' was not declared" in err
    assert len(err.splitlines()) <= 13


def test_the_jetpack_line_comes_from_the_board_not_the_profile(sim_boards) -> None:
    # An Orin NX on JetPack 6 (R36, CUDA 12.6) and one reflashed to JetPack 7.2 (R39, CUDA 13.2).
    (jp6,) = sim_boards(1, "orin-nx-16gb")
    (jp72,) = sim_boards(1, "orin-nx-16gb", jetpack="7.2")
    probed = json.loads(CliRunner().invoke(cli, ["board", "probe", "--board", jp72.name, "--json"]).stdout)
    assert probed["l4t"].startswith("39.") and probed["jetpack"] == "7.2" and probed["cuda"].startswith("13.2")
    old, new = dry_run("--board", jp6.name), dry_run("--board", jp72.name)
    assert old["where"] == "board" and "CUDA 12.6" in old["notes"][0] and "cannot run CUDA 13" in old["notes"][0]
    assert new["where"] == "workstation" and new["cuda"]["origin"] == "pypi-wheels"
    assert "runs CUDA 13.2" in new["notes"][0] and "JetPack 7.2" in new["notes"][0]
    assert old["key"] != new["key"] and new["target"]["cuda_version"].startswith("13.2")
    assert flags(new)["CMAKE_CUDA_ARCHITECTURES"] == "87-real"  # still an Orin
    with pytest.raises(EdgekitError, match="does not run on Thor"):
        sim_boards(1, "thor", jetpack="6")
