"""The build stage: options → plan → (cached artifact | configure, compile, package, verify, store)."""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from edgekit.build.cuda import CUDA_RUNTIME_LIBS, choose_cuda
from edgekit.build.package import LOG, TARBALL, collect, make_tarball, tree_digest, unpacked, write_patch_list
from edgekit.build.patches import report as patch_report
from edgekit.build.plan import BuildPlan, make_plan
from edgekit.build.progress import BuildProgress, StepFailed, run_step
from edgekit.build.source import (
    LLAMA_BUILD_NUMBER,
    LLAMA_CPP_COMMIT,
    LLAMA_CPP_DATE,
    LLAMA_CPP_SHORT,
    Source,
    cached_tree,
    patched,
    resolve_source,
    sources_dir,
)
from edgekit.build.targets import BINARIES, resolve_target
from edgekit.build.verify import verify
from edgekit.errors import EdgekitError
from edgekit.paths import cache_dir
from edgekit.store import Artifact, Store

KIND = "llama-cpp"


@dataclass
class BuildOptions:
    target: str = "host"  # host | orin | thor | a board profile
    cpu_only: bool = False
    src: str | None = None  # dir or tarball; None → the pinned ref from git
    on_board: bool = False
    cuda_home: str | None = None  # a CUDA cross toolkit root, or "pypi" for the wheel tree
    jobs: int | None = None
    force: bool = False
    bundle_cuda_libs: bool = False  # ship libcudart/libcublas too (the board's JetPack has them)
    binaries: tuple[str, ...] = BINARIES
    run_check: bool = True  # run `llama-cli --version` after the build
    build_root: Path | None = None  # default: <cache>/build
    board_cuda: str | None = None  # the CUDA the board reports (its JetPack line), else the profile's
    board_jetpack: str | None = None
    patches: bool = True  # edgekit's llama.cpp patches (build/patches.py); False: the tree as it is


@dataclass
class BuildResult:
    artifact: Artifact
    cached: bool
    seconds: float
    plan: BuildPlan

    @property
    def bin_dir(self) -> Path:
        """The binaries + libraries, unpacked once into the cache (read them, don't edit them)."""
        return unpacked(self.artifact)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": KIND, "key": self.artifact.key, "path": str(self.artifact.path), "cached": self.cached,
                "seconds": round(self.seconds, 3), "target": self.plan.target.slug, "where": self.plan.where,
                "notes": self.plan.notes, "tarball": str(self.artifact.path / TARBALL),
                "verify": self.artifact.manifest.get("verify")}


def _source_for(src: str | None, dry_run: bool, with_patches: bool) -> tuple[Source | None, Path]:
    if src is not None or not dry_run:
        source = resolve_source(src, patches=with_patches)
        return source, source.path
    # A dry run fetches nothing: show where the pinned clone is, or will be (patching a cached one is local).
    tree = sources_dir() / f"llama.cpp-{LLAMA_CPP_SHORT}"
    cached = cached_tree(tree)
    if cached is None:
        return None, tree
    cached = patched(cached) if with_patches else cached
    return cached, cached.path


def prepare(options: BuildOptions, dry_run: bool = False) -> BuildPlan:
    """Everything decided, nothing built: what `--dry-run` prints."""
    target = resolve_target(options.target, options.cpu_only, options.board_cuda, options.board_jetpack)
    source, source_path = _source_for(options.src, dry_run, options.patches)
    choice = choose_cuda(target, options.on_board, options.cuda_home, dry_run) if target.cuda else None
    where = "board" if options.on_board or (choice is not None and choice.where == "board") else "workstation"
    return make_plan(target, source, source_path, choice, build_root=options.build_root, jobs=options.jobs,
                     binaries=options.binaries, where=where)


def build_key(plan: BuildPlan) -> str:
    return Store.key(plan.key_inputs())


@contextlib.contextmanager
def build_lock(console: Console | None, path: Path) -> Iterator[None]:
    """One build at a time per build directory (two in one directory would corrupt each other's objects); builds
    of other targets may run beside it. On-board builds take a lock per board, as they load the board."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if console:
                console.print("[dim]waiting for another edgekit build on this machine to finish…[/dim]")
            fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _lock_path(plan: BuildPlan, runner: Any = None) -> Path:
    """Beside the build directory it guards (``build/.lock-host-cpu``); one per board for on-board builds."""
    if plan.where == "board":
        return cache_dir() / "build" / f".lock-board-{getattr(runner, 'name', 'board')}"
    return plan.build_dir.with_name(f".lock-{plan.build_dir.name}")


def build(options: BuildOptions, console: Console | None = None, runner: Any = None,
          store: Store | None = None) -> BuildResult:
    """Build (or find) llama.cpp for ``options``; the result is a store artifact.

    ``runner`` is a board connection (edgekit.remote.runner), needed only for on-board builds.
    """
    start = time.monotonic()
    store = store or Store()
    plan = prepare(options)
    if plan.where == "board":
        from edgekit.build import onboard

        if runner is None:
            reason = plan.notes[0] if plan.notes else "an on-board build was asked for"
            raise EdgekitError(f"{reason[0].upper()}{reason[1:]}; give --board NAME so edgekit can build there.")
        plan = onboard.board_plan(plan, runner)
    key = build_key(plan)
    found = store.get(KIND, key)
    if found is not None and not options.force:
        return BuildResult(found, True, time.monotonic() - start, plan)
    with build_lock(console, _lock_path(plan, runner)):
        found = store.get(KIND, key)  # another process may have built it while we waited
        if found is not None and not options.force:
            return BuildResult(found, True, time.monotonic() - start, plan)
        staging = store.staging_dir()
        try:
            if plan.where == "board":
                from edgekit.build import onboard

                manifest = onboard.build_on_board(plan, options, runner, staging, console)
            else:
                manifest = _build_here(plan, options, staging, console)
            manifest["seconds"] = round(time.monotonic() - start, 1)
            artifact = store.put(KIND, key, staging, manifest)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return BuildResult(artifact, False, time.monotonic() - start, plan)


def base_manifest(plan: BuildPlan) -> dict[str, Any]:
    return {
        "ref": {"commit": LLAMA_CPP_COMMIT, "short": LLAMA_CPP_SHORT, "date": LLAMA_CPP_DATE,
                "build_number": LLAMA_BUILD_NUMBER},
        "source": plan.source.to_dict() if plan.source else None,
        "patches": patch_report(plan.source.patches if plan.source else {}),
        "target": plan.target.to_dict(),
        "where": plan.where,
        "cmake": {"configure": plan.configure, "build": plan.build, "toolchain": plan.toolchain},
        "compilers": plan.compilers,
        "cuda": plan.cuda.to_dict() if plan.cuda else None,
        "notes": plan.notes,
        "binaries": list(plan.binaries),
        "inputs": plan.key_inputs(),
    }


def _configure_argv(plan: BuildPlan) -> list[str]:
    """Reconfigure from scratch when the flags changed, so no stale cache entry survives."""
    record = plan.build_dir / ".edgekit-configure.json"
    if (plan.build_dir / "CMakeCache.txt").is_file() and (
        not record.is_file() or json.loads(record.read_text()) != plan.configure
    ):
        return [*plan.configure, "--fresh"]
    return plan.configure


def _nvcc_example(build_dir: Path) -> str | None:
    """One real nvcc command line from compile_commands.json (the manifest shows what ran)."""
    path = build_dir / "compile_commands.json"
    if not path.is_file():
        return None
    for entry in json.loads(path.read_text()):
        if entry.get("file", "").endswith(".cu"):
            return entry.get("command")
    return None


def _extra_libs(plan: BuildPlan, options: BuildOptions) -> list[Path]:
    if not (plan.cuda and options.bundle_cuda_libs):
        return []
    libs = []
    for stem in CUDA_RUNTIME_LIBS:
        found = sorted(plan.cuda.lib_dir.glob(f"{stem}.[0-9]*"))
        if not found:
            raise EdgekitError(f"{stem} is not in {plan.cuda.lib_dir}; cannot bundle it.")
        libs.append(min(found, key=lambda p: len(p.name)))  # libcudart.so.13, not .so.13.0.96
    return libs


def configure_and_compile(plan: BuildPlan, console: Console | None, targets: list[str] | None = None,
                          log_path: Path | None = None) -> dict[str, float]:
    """Run cmake configure + build (all binaries, or just ``targets``) with progress and a log."""
    plan.build_dir.mkdir(parents=True, exist_ok=True)
    if plan.toolchain_file and plan.toolchain:
        plan.toolchain_file.write_text(plan.toolchain)
    env = {**os.environ, **plan.env}
    log_path = log_path or plan.build_dir / "edgekit-build.log"
    build_argv = plan.build if targets is None else [*plan.build[:plan.build.index("--target") + 1], *targets]
    times: dict[str, float] = {}
    with open(log_path, "w", buffering=1) as log, BuildProgress(console, f"llama.cpp {plan.target.slug}") as progress:
        try:
            progress.step("configuring")
            times["configure"] = run_step("configure", _configure_argv(plan), log, env)
            (plan.build_dir / ".edgekit-configure.json").write_text(json.dumps(plan.configure))
            progress.step("compiling")
            times["build"] = run_step("build", build_argv, log, env, on_line=progress.on_line)
        except StepFailed as exc:
            raise EdgekitError(
                f"The {exc.step} step of llama.cpp for {plan.target.slug} failed (exit {exc.code}); "
                f"full log: {log_path}\n{exc.error}"
            ) from None
    return times


def _build_here(plan: BuildPlan, options: BuildOptions, staging: Path, console: Console | None) -> dict[str, Any]:
    times = configure_and_compile(plan, console)
    log_path = plan.build_dir / "edgekit-build.log"
    files_dir = Path(tempfile.mkdtemp(prefix=".pkg-", dir=plan.build_dir))
    try:
        shipped = collect(plan.build_dir / "bin", plan.binaries, _extra_libs(plan, options), files_dir)
        lib_path = [plan.cuda.lib_dir] if plan.cuda and not options.bundle_cuda_libs else []
        checked = verify(files_dir, plan.target, run=options.run_check, lib_path=lib_path)
        write_patch_list(files_dir, plan.source.patches if plan.source else {})
        contents = make_tarball(files_dir, staging / TARBALL)
    finally:
        shutil.rmtree(files_dir, ignore_errors=True)
    shutil.copy2(log_path, staging / LOG)
    manifest = base_manifest(plan)
    manifest.update(
        shipped=shipped, contents=contents, tree_sha256=tree_digest(contents), verify=checked.to_dict(),
        durations={k: round(v, 1) for k, v in times.items()}, nvcc_example=_nvcc_example(plan.build_dir),
        ccache=bool(plan.env),
    )
    return manifest



def compile_objects(options: BuildOptions, objects: list[str], console: Console | None = None) -> list[Path]:
    """Configure as for a full build, then compile only ``objects`` of ggml-cuda (e.g. ``arange.cu``):
    a quick, real check of a CUDA toolchain (CI compiles one per SM), in its own build dir."""
    options = dataclasses.replace(options, build_root=options.build_root or cache_dir() / "build" / "objects")
    plan = prepare(options)
    if plan.where != "workstation":
        raise EdgekitError(f"Cannot compile {options.target} objects here: {plan.notes[0] if plan.notes else ''}.")
    subdir = "ggml/src/ggml-cuda/CMakeFiles/ggml-cuda.dir"
    targets = [f"{subdir}/{name}.o" for name in objects]
    with build_lock(console, _lock_path(plan)):
        configure_and_compile(plan, console, targets=targets)
    return [plan.build_dir / t for t in targets]
