"""The whole build pipeline on a tiny llama.cpp-shaped CMake project: real cmake, ninja, gcc
(host and aarch64 cross), qemu and store, in seconds instead of minutes. edgekit's llama.cpp patches do not
apply to such a tree: it is built as it is (``patches=False``, `edgekit build --no-patches`), and without that
the build stops with the patch's name."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import pytest

from edgekit.build import BINARIES, BuildOptions, build
from edgekit.build.elf import read_header
from edgekit.errors import EdgekitError
from edgekit.store import Store

CMAKE = """cmake_minimum_required(VERSION 3.14)
project(fake C CXX)
set(CMAKE_RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bin)
set(CMAKE_LIBRARY_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bin)
add_subdirectory(ggml)
add_library(llama SHARED src/llama.cpp)
set_target_properties(llama PROPERTIES VERSION 0.0.1 SOVERSION 0)
target_compile_definitions(llama PRIVATE BUILD_NUMBER=${LLAMA_BUILD_NUMBER} BUILD_COMMIT="${LLAMA_BUILD_COMMIT}")
target_link_libraries(llama PRIVATE ggml)
foreach(name llama-server llama-cli llama-bench llama-quantize llama-perplexity)
  add_executable(${name} tools/server/main.cpp)
  target_link_libraries(${name} PRIVATE llama)
endforeach()
"""
GGML = "add_library(ggml SHARED ggml.c)\n"
LLAMA = """#include <cstdio>
extern "C" int ggml_answer(void);
void llama_print_version() {
    std::printf("version: %d (%s) ggml %d\\n", BUILD_NUMBER, BUILD_COMMIT, ggml_answer());
}
"""
MAIN = """#include <cstring>
void llama_print_version();
int main(int argc, char ** argv) {
    if (argc > 1 && std::strcmp(argv[1], "--version") == 0) { llama_print_version(); return 0; }
    return 1;
}
"""


def fake_tree(root: Path, main: str = MAIN) -> Path:
    files = {"CMakeLists.txt": CMAKE, "ggml/CMakeLists.txt": GGML, "src/llama.cpp": LLAMA,
             "ggml/ggml.c": "int ggml_answer(void) { return 42; }\n", "tools/server/main.cpp": main}
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("EDGEKIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("EDGEKIT_STORE", str(tmp_path / "store"))
    monkeypatch.setenv("CCACHE_DISABLE", "1")  # keep the shared ccache free of throwaway objects
    return tmp_path


def test_host_pipeline_store_cache_and_rpath(env: Path) -> None:
    src = fake_tree(env / "src")
    first = build(BuildOptions(target="host", src=str(src), patches=False))
    assert not first.cached
    manifest = first.artifact.manifest
    assert {f["name"] for f in manifest["files"]} == {"llama.cpp.tar.gz", "build.log"}
    shipped = set(manifest["shipped"])
    assert set(BINARIES) <= shipped and {"libllama.so.0", "libggml.so"} <= shipped
    assert manifest["verify"]["version_output"].startswith("version: 20261001 (unknown)")
    assert set(manifest["verify"]["machine"].values()) == {"x86_64"}
    assert "-DGGML_NATIVE=OFF" in manifest["cmake"]["configure"] and manifest["compilers"]["cxx"]
    assert "$ $" not in (first.artifact.path / "build.log").read_text()
    # Binaries find their libraries through RUNPATH $ORIGIN, wherever the directory lands.
    moved = env / "elsewhere"
    shutil.copytree(first.bin_dir, moved, symlinks=True)
    out = subprocess.run([str(moved / "llama-server"), "--version"], capture_output=True, text=True,
                         env={"PATH": "/usr/bin:/bin"}, check=True)
    assert "ggml 42" in out.stdout

    start = time.monotonic()
    again = build(BuildOptions(target="host", src=str(src), patches=False))
    assert again.cached and again.artifact.key == first.artifact.key
    assert time.monotonic() - start < 1.0

    (src / "src" / "llama.cpp").write_text(LLAMA + "// changed\n")
    changed = build(BuildOptions(target="host", src=str(src), patches=False))
    assert not changed.cached and changed.artifact.key != first.artifact.key
    assert len(Store().list("llama-cpp")) == 2


def test_failed_compile_reports_the_compiler_error(env: Path) -> None:
    src = fake_tree(env / "src", main=MAIN.replace("return 1;", "return undefined_thing;"))
    with pytest.raises(EdgekitError) as info:
        build(BuildOptions(target="host", src=str(src), patches=False))
    message = str(info.value)
    assert "The build step of llama.cpp for host-cpu failed" in message
    assert "main.cpp:5:12: error:" in message and "undefined_thing" in message
    assert len(message.splitlines()) < 16
    assert Store().list("llama-cpp") == []


@pytest.mark.skipif(shutil.which("aarch64-linux-gnu-g++") is None or shutil.which("qemu-aarch64") is None,
                    reason="needs gcc-aarch64-linux-gnu, g++-aarch64-linux-gnu and qemu-user")
def test_aarch64_cross_pipeline_runs_under_qemu(env: Path) -> None:
    src = fake_tree(env / "src")
    result = build(BuildOptions(target="orin", cpu_only=True, src=str(src), patches=False))
    verify = result.artifact.manifest["verify"]
    assert set(verify["machine"].values()) == {"aarch64"}
    assert verify["version_runner"][0].endswith("qemu-aarch64")
    assert "version: 20261001" in verify["version_output"]
    assert read_header(result.bin_dir / "llama-cli").machine == "aarch64"
    assert tuple(map(int, verify["glibc_needed"].split("."))) <= (2, 35)


def test_on_board_build_through_a_runner(env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--on-board: the same flags run through the board runner; here the board is this machine."""
    from edgekit.remote.runner import LocalRunner

    monkeypatch.setenv("HOME", str(env / "board-home"))
    (env / "board-home").mkdir()
    src = fake_tree(env / "src")
    result = build(BuildOptions(target="host", src=str(src), on_board=True, patches=False), runner=LocalRunner("local"))
    manifest = result.artifact.manifest
    assert manifest["where"] == "board" and manifest["board"] == "local"
    assert manifest["cmake"]["configure"][2] == str(env / "board-home/edgekit/build/src") + "/" + (
        Path(manifest["cmake"]["configure"][2]).name)
    assert manifest["verify"]["version_output"].startswith("version: 20261001")
    assert (env / "board-home/edgekit/build/host-cpu/bin/llama-server").is_file()
    assert set(BINARIES) <= set(manifest["shipped"])
    again = build(BuildOptions(target="host", src=str(src), on_board=True, patches=False), runner=LocalRunner("local"))
    assert again.cached


def test_a_tree_the_patches_do_not_apply_to_stops_with_the_patchs_name(env: Path) -> None:
    src = fake_tree(env / "src")
    with pytest.raises(EdgekitError, match=r"llama.cpp patch 0001-\S+ does not apply to .*--no-patches"):
        build(BuildOptions(target="host", src=str(src)))
    assert not list((env / "cache" / "src").glob("patched-*"))  # nothing half-made is left behind
