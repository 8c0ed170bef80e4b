"""`--on-board`: the same cmake flags, run natively on the Jetson over SSH; binaries come back
into the local store.

Needed for Orin on JetPack 6 (CUDA 12.6) when no host CUDA 12 cross toolkit exists. The board
needs cmake, ninja (or make) and gcc from JetPack's Ubuntu; the source goes up as a tarball.
Remote execution is left to a runner (edgekit.remote.runner: ``run(argv, check=, timeout=)`` →
result with ``exit_code``, ``stdout``, ``stderr``) and file moves to ``put``/``get`` below.
"""

from __future__ import annotations

import dataclasses
import hashlib
import shlex
import shutil
import tarfile
import tempfile
from pathlib import Path, PurePosixPath
from typing import Any, Protocol

from rich.console import Console

from edgekit.build.cuda import CudaToolkit
from edgekit.build.package import LOG, TARBALL, collect, make_tarball, tree_digest, write_patch_list
from edgekit.build.plan import BuildPlan, make_plan
from edgekit.build.source import LLAMA_CPP_SHORT
from edgekit.build.untar import extract_all
from edgekit.build.verify import VERSION_BINARY, verify
from edgekit.errors import EdgekitError
from edgekit.paths import cache_dir

BUILD_TIMEOUT_S = 4 * 3600  # a full CUDA build on an Orin Nano takes well over an hour
_SKIP_DIRS = {".git", "models", "media", "docs", ".github", "tests", "examples", "benches"}


class BoardRunner(Protocol):
    name: str

    def run(self, argv: list[str], *, check: bool = True, timeout: float | None = None) -> Any: ...


def put_file(runner: BoardRunner, local: Path, remote: str) -> None:
    """Upload over the runner's SFTP, or copy when the board is this machine."""
    if hasattr(runner, "sftp"):
        sftp = runner.sftp()
        sftp.put(str(local), remote + ".part")
        sftp.posix_rename(remote + ".part", remote)
    else:
        shutil.copyfile(local, remote)


def get_file(runner: BoardRunner, remote: str, local: Path) -> None:
    if hasattr(runner, "sftp"):
        runner.sftp().get(remote, str(local))
    else:
        shutil.copyfile(remote, local)


def _remote_base(runner: BoardRunner) -> str:
    """The board's edgekit directory, absolute (the probe expands a ``~``)."""
    from edgekit.remote.probe import probe

    return probe(runner, getattr(getattr(runner, "board", None), "base", "~/edgekit")).base


def _first_line(runner: BoardRunner, argv: list[str]) -> str:
    res = runner.run(argv, check=False)
    lines = [ln for ln in (res.stdout or res.stderr).splitlines() if ln.strip()]
    return lines[0].strip() if res.exit_code == 0 and lines else "missing"


def board_plan(plan: BuildPlan, runner: BoardRunner | None, base: str = "~/edgekit") -> BuildPlan:
    """The workstation plan rewritten for the board: its paths, its compilers, its CUDA."""
    if runner is not None:
        base = _remote_base(runner)
    root = PurePosixPath(base) / "build"
    source_path = Path(str(root / "src" / f"llama.cpp-{_source_tag(plan)}"))
    compilers: dict[str, str] = {"where": "board"}
    cuda = None
    if runner is not None:
        for name, argv in {"cc": ["gcc", "--version"], "cxx": ["g++", "--version"],
                           "cmake": ["cmake", "--version"], "ninja": ["ninja", "--version"]}.items():
            compilers[name] = _first_line(runner, argv)
        missing = [n for n in ("cc", "cxx", "cmake", "ninja") if compilers[n] == "missing"]
        if missing:
            raise EdgekitError(f"Board {runner.name!r} lacks {', '.join(missing)}: "
                               "run `sudo apt install build-essential cmake ninja-build` there.")
    if plan.target.cuda:
        nvcc = "/usr/local/cuda/bin/nvcc"
        version = ""
        if runner is not None:
            out = runner.run([nvcc, "--version"], check=False)
            if out.exit_code != 0:
                raise EdgekitError(f"Board {runner.name!r} has no {nvcc}; install JetPack's CUDA toolkit "
                                   "(sudo apt install nvidia-jetpack) or build with --cpu-only.")
            version = out.stdout.strip().splitlines()[-1].split("V")[-1]
            compilers["nvcc"] = version
        cuda = CudaToolkit(Path("/usr/local/cuda"), Path(nvcc), version, "board", None)
    choice_reason = plan.notes
    new = make_plan(plan.target, plan.source, source_path, None, build_root=Path(str(root)), jobs=None,
                    use_ccache=False, binaries=plan.binaries, where="board")
    configure = list(new.configure)
    if cuda is not None:
        configure += ["-DGGML_CUDA=ON"] if "-DGGML_CUDA=ON" not in configure else []
        configure += [f"-DCMAKE_CUDA_COMPILER={cuda.nvcc}"]
    # The board's own core count, not the workstation's.
    build = list(new.build)
    build[build.index("-j") + 1] = "$(nproc)"
    return dataclasses.replace(new, configure=configure, build=build, cuda=cuda, compilers=compilers,
                               notes=choice_reason)


def _source_tag(plan: BuildPlan) -> str:
    """A short name per source identity (the whole identity counts: a patched tree is not its original)."""
    ident = plan.source.identity if plan.source else f"git:{LLAMA_CPP_SHORT}"
    return f"{ident.split(':', 1)[0]}-{hashlib.sha256(ident.encode()).hexdigest()[:20]}"


def _source_tarball(plan: BuildPlan) -> Path:
    """The source tree without .git, models and docs, packed once per source identity."""
    assert plan.source is not None
    out = cache_dir() / "build" / "board-src" / f"{_source_tag(plan)}.tar.gz"
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".part")

    def skip(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        parts = PurePosixPath(info.name).parts
        return None if len(parts) > 1 and parts[1] in _SKIP_DIRS else info

    with tarfile.open(tmp, "w:gz") as tf:
        tf.add(plan.source.path, arcname="llama.cpp", filter=skip)
    tmp.rename(out)
    return out


def build_on_board(plan: BuildPlan, options: Any, runner: BoardRunner, staging: Path,
                   console: Console | None) -> dict[str, Any]:
    """Upload the source, configure + build there, fetch bin/ back, verify, return the manifest."""
    from edgekit.build.builder import base_manifest

    src_dir = str(plan.source_path)
    build_dir = str(plan.build_dir)
    root = str(PurePosixPath(src_dir).parent.parent)
    say = console.print if console else (lambda *_a, **_k: None)
    log_lines: list[str] = []

    def run(argv: list[str], timeout: float | None = None) -> Any:
        log_lines.append(f"$ {shlex.join(argv)}")
        res = runner.run(argv, check=False, timeout=timeout)
        log_lines.extend([res.stdout, res.stderr])
        if res.exit_code != 0:
            from edgekit.build.progress import last_error

            (staging / LOG).write_text("\n".join(log_lines))
            raise EdgekitError(f"`{shlex.join(argv)[:80]}` failed on board {runner.name!r} "
                               f"(exit {res.exit_code}):\n{last_error(res.stdout + res.stderr)}")
        return res

    run(["mkdir", "-p", str(PurePosixPath(src_dir).parent), build_dir])
    if not runner.run(["test", "-f", f"{src_dir}/CMakeLists.txt"], check=False, timeout=30).ok:
        say(f"[dim]uploading llama.cpp source to {runner.name}…[/dim]")
        tarball = _source_tarball(plan)
        remote_tar = f"{root}/src/{tarball.name}"
        put_file(runner, tarball, remote_tar)
        tmp = f"{src_dir}.tmp"
        run(["rm", "-rf", tmp])
        run(["mkdir", "-p", tmp])
        run(["tar", "-xzf", remote_tar, "-C", tmp, "--strip-components=1"])
        run(["mv", "-T", tmp, src_dir])
        run(["rm", "-f", remote_tar])
    say(f"[dim]configuring and compiling on {runner.name} (this takes a while)…[/dim]")
    run(plan.configure, timeout=1800)
    jobs = run(["nproc"]).stdout.strip() or "2"
    run([jobs if a == "$(nproc)" else a for a in plan.build], timeout=BUILD_TIMEOUT_S)
    bin_remote = f"{build_dir}/bin"
    names = run(["ls", "-1", bin_remote]).stdout.split()
    wanted = [n for n in names if n in plan.binaries or ".so" in n]
    out_tar = f"{build_dir}/edgekit-bin.tar.gz"
    run(["tar", "-czf", out_tar, "-C", bin_remote, "--", *wanted])
    with tempfile.TemporaryDirectory(dir=staging.parent) as tmpdir:
        local_tar = Path(tmpdir) / "bin.tar.gz"
        get_file(runner, out_tar, local_tar)
        fetched = Path(tmpdir) / "bin"
        fetched.mkdir()
        with tarfile.open(local_tar) as tf:
            extract_all(tf, fetched, "data")
        files_dir = Path(tmpdir) / "pkg"
        shipped = collect(fetched, plan.binaries, [], files_dir)
        checked = verify(files_dir, plan.target, run=False)
        write_patch_list(files_dir, plan.source.patches if plan.source else {})
        contents = make_tarball(files_dir, staging / TARBALL)
    version = run([f"{bin_remote}/{VERSION_BINARY}", "--version"]) if options.run_check else None
    if version is not None:
        checked.version_output = (version.stdout + version.stderr).strip()[-500:]
        checked.version_runner = [f"board:{runner.name}"]
    (staging / LOG).write_text("\n".join(log_lines))
    manifest = base_manifest(plan)
    manifest.update(shipped=shipped, contents=contents, tree_sha256=tree_digest(contents),
                    verify=checked.to_dict(), board=runner.name)
    return manifest
