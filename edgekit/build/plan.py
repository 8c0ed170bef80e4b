"""The exact cmake invocations of a build, computed without running anything (`--dry-run`)."""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from edgekit.build.cuda import CudaChoice, CudaToolkit
from edgekit.build.memo import remember
from edgekit.build.source import LLAMA_BUILD_NUMBER, LLAMA_CPP_COMMIT, LLAMA_CPP_SHORT, Source
from edgekit.build.targets import AARCH64_TRIPLE, BINARIES, Target, host_machine
from edgekit.paths import cache_dir

SCHEMA = 1  # bump when a change of edgekit's build logic must invalidate cached builds

# Flags every build gets: reproducible, offline (no prebuilt web UI download, no OpenSSL), no tests.
COMMON_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=ON",
    "-DGGML_NATIVE=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    f"-DLLAMA_BUILD_NUMBER={LLAMA_BUILD_NUMBER}",
    # Binaries and shared libraries ship in one directory and find each other there.
    "-DCMAKE_BUILD_WITH_INSTALL_RPATH=ON",
    "-DCMAKE_INSTALL_RPATH=$ORIGIN",
    "-DCMAKE_EXPORT_COMPILE_COMMANDS=ON",
    # edgekit sets the ccache launchers itself, so the flags do not depend on what is installed.
    "-DGGML_CCACHE=OFF",
)


def toolchain_text(triple: str = AARCH64_TRIPLE) -> str:
    """CMake toolchain for Debian's cross gcc; its sysroot is /usr/<triple>."""
    return "\n".join([
        "set(CMAKE_SYSTEM_NAME Linux)",
        "set(CMAKE_SYSTEM_PROCESSOR aarch64)",
        f"set(CMAKE_C_COMPILER {triple}-gcc)",
        f"set(CMAKE_CXX_COMPILER {triple}-g++)",
        f"set(CMAKE_FIND_ROOT_PATH /usr/{triple})",
        "set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)",
        "set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)",
        "set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)",
        "set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)",
        "",
    ])


@cache
def tool_version(tool: str) -> str:
    """First line of `tool --version` (what goes into the key and the manifest)."""
    path = shutil.which(tool)
    if path is None:
        return "missing"

    def ask() -> str:
        proc = subprocess.run([path, "--version"], capture_output=True, text=True, check=False)
        lines = [ln for ln in (proc.stdout or proc.stderr).splitlines() if ln.strip()]
        return lines[0].strip() if lines else "unknown"

    return remember("version", Path(path), ask)


@dataclass
class BuildPlan:
    target: Target
    source: Source | None  # None in a dry run without a source yet
    source_path: Path  # where the tree is, or will be
    build_dir: Path
    where: str  # workstation | board
    cuda: CudaToolkit | None
    configure: list[str]
    build: list[str]
    env: dict[str, str]
    toolchain_file: Path | None
    toolchain: str | None
    compilers: dict[str, str]
    notes: list[str] = field(default_factory=list)
    binaries: tuple[str, ...] = BINARIES

    @property
    def cross(self) -> bool:
        return self.target.machine != host_machine() and self.where == "workstation"

    def nvcc_template(self) -> list[str]:
        """The nvcc line CMake runs per .cu object (flags that matter; defines/includes elided)."""
        if not self.target.cuda:
            return []
        nvcc = str(self.cuda.nvcc) if self.cuda else "/usr/local/cuda/bin/nvcc"
        argv = [nvcc, "-forward-unknown-to-host-compiler"]
        if self.cross:
            argv += [f"-ccbin={AARCH64_TRIPLE}-g++", "-target-dir", self.cuda.target_dir or "aarch64-linux"]
        arch = self.target.cuda_arch
        argv += ["-O3", "-DNDEBUG", f"--generate-code=arch=compute_{arch},code=[sm_{arch}]",
                 "-Xcompiler=-fPIC", "-use_fast_math", "-extended-lambda", "-x", "cu", "-c", "<file>.cu",
                 "-o", "<file>.cu.o"]
        return argv

    def key_inputs(self) -> dict[str, object]:
        """What decides the output: a change to any of these rebuilds, nothing else does."""
        def norm(arg: str) -> str:
            # Paths of this machine's cache and tree do not change the binaries.
            out = arg.replace(str(self.source_path), "$SRC").replace(str(self.build_dir), "$BUILD")
            return out.replace(str(cache_dir()), "$CACHE")
        launchers = ("-DCMAKE_C_COMPILER_LAUNCHER", "-DCMAKE_CXX_COMPILER_LAUNCHER", "-DCMAKE_CUDA_COMPILER_LAUNCHER")
        return {
            "stage": "llama.cpp-build",
            "schema": SCHEMA,
            "source": self.source.identity if self.source else f"git:{LLAMA_CPP_COMMIT}",
            "target": self.target.to_dict(),
            "where": self.where,
            "configure": [norm(a) for a in self.configure if not a.startswith(launchers)],
            "toolchain": self.toolchain,
            "compilers": self.compilers,
            "binaries": list(self.binaries),
        }

    def to_dict(self) -> dict[str, object]:
        return {
            "target": self.target.to_dict(),
            "where": self.where,
            "source": self.source.to_dict() if self.source else {"path": str(self.source_path)},
            "build_dir": str(self.build_dir),
            "cuda": self.cuda.to_dict() if self.cuda else None,
            "toolchain_file": str(self.toolchain_file) if self.toolchain_file else None,
            "toolchain": self.toolchain,
            "configure": self.configure,
            "build": self.build,
            "nvcc": self.nvcc_template(),
            "env": self.env,
            "compilers": self.compilers,
            "binaries": list(self.binaries),
            "notes": self.notes,
        }


def ccache_env() -> dict[str, str]:
    """ccache in edgekit's cache (kept by CI with the rest), paths made relative for reuse."""
    return {
        "CCACHE_DIR": os.environ.get("CCACHE_DIR", str(cache_dir() / "ccache")),
        "CCACHE_BASEDIR": str(cache_dir()),
        "CCACHE_NOHASHDIR": "1",
        "CCACHE_SLOPPINESS": "time_macros,include_file_mtime,include_file_ctime",
        "CCACHE_MAXSIZE": os.environ.get("CCACHE_MAXSIZE", "10G"),
    }


def make_plan(target: Target, source: Source | None, source_path: Path, choice: CudaChoice | None,
              build_root: Path | None = None, jobs: int | None = None, use_ccache: bool | None = None,
              binaries: tuple[str, ...] = BINARIES, where: str | None = None) -> BuildPlan:
    """The configure + build argv for ``target`` on the workstation (or, with choice.where=board,
    the same flags for a native build on the board, where paths are filled in remotely)."""
    where = where or (choice.where if choice else "workstation")
    build_dir = (build_root or cache_dir() / "build") / target.slug
    cuda = choice.toolkit if choice else None
    cross = target.machine != host_machine() and where == "workstation"
    if use_ccache is None:
        use_ccache = shutil.which("ccache") is not None and where == "workstation"

    # The binaries say which commit they are; a tree git cannot date says "unknown", not the pin.
    commit = LLAMA_CPP_SHORT if source is None else (source.commit or "unknown")[:7]
    common = list(COMMON_FLAGS)
    common.insert(common.index(f"-DLLAMA_BUILD_NUMBER={LLAMA_BUILD_NUMBER}") + 1, f"-DLLAMA_BUILD_COMMIT={commit}")
    configure = ["cmake", "-S", str(source_path), "-B", str(build_dir), "-G", "Ninja", *common]
    toolchain_file = toolchain = None
    compilers: dict[str, str] = {"cmake": tool_version("cmake"), "ninja": tool_version("ninja")}
    if cross:
        toolchain = toolchain_text()
        toolchain_file = build_dir.parent / f"{AARCH64_TRIPLE}.cmake"
        configure.append(f"-DCMAKE_TOOLCHAIN_FILE={toolchain_file}")
        compilers["cc"] = tool_version(f"{AARCH64_TRIPLE}-gcc")
        compilers["cxx"] = tool_version(f"{AARCH64_TRIPLE}-g++")
    elif where == "workstation":
        compilers["cc"] = tool_version("cc")
        compilers["cxx"] = tool_version("c++")
    if target.cpu_arch:
        configure.append(f"-DGGML_CPU_ARM_ARCH={target.cpu_arch}")
    if target.cuda:
        configure += ["-DGGML_CUDA=ON", f"-DCMAKE_CUDA_ARCHITECTURES={target.cuda_arch}-real",
                      # No libcuda at link time (not on a workstation) and none of the VMM API.
                      "-DGGML_CUDA_NO_VMM=ON"]
        if cuda is not None:
            configure += [f"-DCMAKE_CUDA_COMPILER={cuda.nvcc}", f"-DCUDAToolkit_ROOT={cuda.root}"]
            compilers["nvcc"] = cuda.version or "unknown (toolkit not assembled yet)"
        if cross and cuda is not None:
            # The linker must find libcudart/libcublas (needed by libggml-cuda.so) in the aarch64 target
            # tree to link the executables; without it every binary fails with "libcudart.so.13 ...
            # not found (try using -rpath or -rpath-link)". At run time they come from $ORIGIN.
            target_lib = cuda.root / "targets" / (cuda.target_dir or "aarch64-linux") / "lib"
            configure += [f"-DCMAKE_CUDA_HOST_COMPILER={AARCH64_TRIPLE}-g++",
                          f"-DCMAKE_CUDA_FLAGS=-target-dir {cuda.target_dir}",
                          f"-DCMAKE_EXE_LINKER_FLAGS=-Wl,-rpath-link,{target_lib}",
                          f"-DCMAKE_SHARED_LINKER_FLAGS=-Wl,-rpath-link,{target_lib}"]
    if use_ccache:
        configure += [f"-DCMAKE_{lang}_COMPILER_LAUNCHER=ccache" for lang in ("C", "CXX")]
        if target.cuda:
            configure.append("-DCMAKE_CUDA_COMPILER_LAUNCHER=ccache")
    jobs = jobs or os.cpu_count() or 2
    build = ["cmake", "--build", str(build_dir), "-j", str(jobs), "--target", *binaries]
    notes = [choice.reason] if choice else []
    if source is not None and not source.pinned:
        notes.append(f"the source is at commit {commit}, not edgekit's pinned {LLAMA_CPP_SHORT}")
    return BuildPlan(target, source, source_path, build_dir, where, cuda, configure, build,
                     ccache_env() if use_ccache else {}, toolchain_file, toolchain, compilers, notes,
                     binaries)
