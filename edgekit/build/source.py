"""The llama.cpp source tree every build uses: one pinned ref, found or fetched into the cache.

Three ways to a tree, all ending in a real (symlink-free) path, since ninja loops forever on a
build configured through a symlinked source path:

- ``--src DIR``: a llama.cpp checkout (or a directory holding one, e.g. an unpacked sdist);
- ``--src TARBALL``: unpacked once into the cache (the llama-cpp-python sdist works: its
  ``vendor/llama.cpp`` is the pinned ref);
- nothing: ``git clone`` + checkout of the pinned commit into the cache; where GitHub cannot be
  reached, the llama-cpp-python sdist from PyPI (it vendors that same commit), said on stderr.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgekit.build.downloads import pip_download
from edgekit.build.memo import remember
from edgekit.build.patches import apply_series, link_tree, series, series_id
from edgekit.build.untar import extract_all
from edgekit.errors import EdgekitError
from edgekit.paths import cache_dir

# The one pinned llama.cpp ref. It has Gemma 4 (`gemma4`, `gemma4-assistant`) and
# `--spec-type draft-mtp`; the llama-cpp-python 0.3.36 sdist vendors exactly this commit.
LLAMA_CPP_REPO = "https://github.com/ggml-org/llama.cpp.git"
LLAMA_CPP_COMMIT = "0c1e57098bba43ac29e6e3b677cdceebdd22334f"
LLAMA_CPP_SHORT = LLAMA_CPP_COMMIT[:7]
LLAMA_CPP_DATE = "2026-10-01"
# A shallow tree cannot count upstream commits, so the build number comes from the ref's date:
# monotonic across refs, and the same on every machine.
LLAMA_BUILD_NUMBER = int(LLAMA_CPP_DATE.replace("-", ""))

SDIST_REQUIREMENT = "llama-cpp-python==0.3.36"
SDIST_FILENAME = "llama_cpp_python-0.3.36.tar.gz"
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"

MARKER = ".edgekit-source.json"
_FINGERPRINT_DIRS = ("CMakeLists.txt", "cmake", "common", "ggml", "include", "src", "tools", "vendor")


@dataclass(frozen=True)
class Source:
    """A llama.cpp tree plus what identifies its content for the build cache."""

    path: Path  # the llama.cpp root (real path)
    identity: str  # goes into the build key: same identity → same tree content
    commit: str | None  # git commit when it can be told, else None
    origin: str  # "git", "tarball" or "dir"
    patches: dict[str, str] = field(default_factory=dict)  # edgekit's llama.cpp patches: name → state

    @property
    def pinned(self) -> bool:
        return self.commit == LLAMA_CPP_COMMIT

    def to_dict(self) -> dict[str, object]:
        return {"path": str(self.path), "identity": self.identity, "commit": self.commit,
                "origin": self.origin, "pinned_commit": LLAMA_CPP_COMMIT, "patches": self.patches}


def sources_dir() -> Path:
    return cache_dir() / "src"


def is_llama_tree(path: Path) -> bool:
    return (path / "CMakeLists.txt").is_file() and (path / "ggml" / "CMakeLists.txt").is_file() \
        and (path / "tools" / "server").is_dir()


def find_llama_root(path: Path) -> Path | None:
    """The llama.cpp root at or just under ``path`` (an sdist keeps it at vendor/llama.cpp)."""
    candidates = [path, path / "vendor" / "llama.cpp", path / "llama.cpp"]
    for child in sorted(p for p in path.iterdir() if p.is_dir()) if path.is_dir() else []:
        candidates += [child, child / "vendor" / "llama.cpp"]
    return next((c.resolve() for c in candidates if is_llama_tree(c)), None)


def git_commit(path: Path) -> str | None:
    """HEAD of the tree, if git can tell (the sdist keeps the submodule's .git/modules)."""
    if shutil.which("git") is None:
        return None
    proc = subprocess.run(["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=False)
    out = proc.stdout.strip()
    return out if proc.returncode == 0 and len(out) == 40 else None


def _fingerprint(root: Path) -> str:
    """Cheap content identity of a user tree: path, size and mtime of every build input."""
    digest = hashlib.sha256()
    for top in _FINGERPRINT_DIRS:
        base = root / top
        paths = [base] if base.is_file() else sorted(base.rglob("*")) if base.is_dir() else []
        for p in paths:
            if p.is_file():
                st = p.stat()
                digest.update(f"{p.relative_to(root)}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:20]


def _read_marker(root: Path) -> dict[str, str] | None:
    marker = root / MARKER
    if not marker.is_file():
        return None
    try:
        return json.loads(marker.read_text())
    except (OSError, ValueError):
        return None


def cached_tree(tree_dir: Path) -> Source | None:
    """The tree edgekit unpacked or cloned into ``tree_dir`` earlier, if it is there and whole."""
    info = _read_marker(tree_dir)
    if not info:
        return None
    root = (tree_dir / info["root"]).resolve()
    if not is_llama_tree(root):
        return None
    return Source(root, info["identity"], info.get("commit"), info["origin"], info.get("patches") or {})


def _sha256(path: Path) -> str:
    def compute() -> str:
        digest = hashlib.sha256()
        with open(path, "rb") as fh:
            while chunk := fh.read(1 << 20):
                digest.update(chunk)
        return digest.hexdigest()

    return remember("sha256", path, compute)


def _publish(tmp: Path, final: Path) -> None:
    """Rename a finished tree into place; a concurrent winner's tree is kept instead."""
    try:
        os.rename(tmp, final)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if not final.is_dir():
            raise


def _make_tree(prefix: str, final: Path, fill: Callable[[Path], dict[str, Any]], replace: bool = False) -> Source:
    """A tree made in a temporary directory of the cache (``fill`` puts it there and returns its marker), then put
    at ``final``: beside a tree already there (a concurrent maker won), or in its place (``replace``)."""
    sources_dir().mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=prefix, dir=sources_dir()))
    try:
        (tmp / MARKER).write_text(json.dumps(fill(tmp), indent=2))
        (_swap if replace else _publish)(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    source = cached_tree(final)
    assert source is not None
    return source


def _from_tarball(tarball: Path) -> Source:
    sha = _sha256(tarball)
    tree_dir = sources_dir() / f"tar-{sha[:16]}"
    cached = cached_tree(tree_dir)
    if cached:
        return cached

    def unpack(tmp: Path) -> dict[str, Any]:
        try:
            with tarfile.open(tarball) as tf:
                extract_all(tf, tmp, "tar")
        except (tarfile.TarError, OSError) as exc:
            raise EdgekitError(f"Cannot unpack {tarball}: {exc}.") from None
        root = find_llama_root(tmp)
        if root is None:
            raise EdgekitError(f"{tarball} holds no llama.cpp source tree (no CMakeLists.txt with ggml/).")
        return {"root": root.relative_to(tmp.resolve()).as_posix(), "identity": f"tar:{sha}",
                "commit": git_commit(root), "origin": "tarball", "tarball": str(tarball)}

    return _make_tree(".unpack-", tree_dir, unpack)


def _from_dir(path: Path) -> Source:
    marked = cached_tree(path)
    if marked:
        return marked
    root = find_llama_root(path)
    if root is None:
        raise EdgekitError(f"{path} is not a llama.cpp source tree (no CMakeLists.txt with ggml/ and tools/).")
    commit = git_commit(root)
    return Source(root, f"dir:{commit or 'nogit'}:{_fingerprint(root)}", commit, "dir")


def _git(args: list[str], cwd: Path | None = None) -> None:
    # A network that drops GitHub's packets (rather than refusing them) must not hang the deploy.
    env = {**os.environ, "GIT_HTTP_LOW_SPEED_LIMIT": "1000", "GIT_HTTP_LOW_SPEED_TIME": "60",
           "GIT_TERMINAL_PROMPT": "0"}
    try:
        proc = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=False, env=env,
                              timeout=1800)
    except subprocess.TimeoutExpired:
        raise EdgekitError(f"git {args[0]} of llama.cpp took over 30 min (offline? pass --src PATH|TARBALL).") from None
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise EdgekitError(f"git {args[0]} of llama.cpp failed: {last} (offline? pass --src PATH|TARBALL).")


def _from_git() -> Source:
    tree_dir = sources_dir() / f"llama.cpp-{LLAMA_CPP_SHORT}"
    cached = cached_tree(tree_dir)
    if cached:
        return cached
    if shutil.which("git") is None:
        raise EdgekitError("git is not installed; install it or pass --src PATH|TARBALL.")

    def clone(tmp: Path) -> dict[str, Any]:
        # Fetch just the pinned commit: a full clone of llama.cpp is over a gigabyte.
        _git(["init", "-q", str(tmp)])
        _git(["fetch", "-q", "--depth", "1", LLAMA_CPP_REPO, LLAMA_CPP_COMMIT], cwd=tmp)
        _git(["checkout", "-q", "--detach", "FETCH_HEAD"], cwd=tmp)
        return {"root": ".", "identity": f"git:{LLAMA_CPP_COMMIT}", "commit": LLAMA_CPP_COMMIT, "origin": "git"}

    return _make_tree(".clone-", tree_dir, clone)


def _from_git_or_sdist(note: Callable[[str], None]) -> Source:
    """The pinned clone; where GitHub cannot be reached (a PyPI-only network), the same commit from the sdist.

    Either tree already in the cache is the pinned commit: it is used without asking GitHub again (a
    network that drops GitHub's packets would make every deploy wait for git's timeout).
    """
    for tree in (sources_dir() / f"llama.cpp-{LLAMA_CPP_SHORT}", sources_dir() / f"tar-{SDIST_SHA256[:16]}"):
        if (cached := cached_tree(tree)) is not None:
            return cached
    try:
        return _from_git()
    except EdgekitError as exc:
        try:
            sdist = fetch_sdist()
        except EdgekitError as sdist_exc:
            raise EdgekitError(f"{str(exc).rstrip('.')}; the {SDIST_REQUIREMENT} sdist from PyPI failed too: "
                               f"{sdist_exc}") from None
        note(f"GitHub unreachable ({exc}); using llama.cpp {LLAMA_CPP_SHORT} as vendored by the "
             f"{SDIST_REQUIREMENT} sdist from PyPI ({sdist}).")
        return _from_tarball(sdist)


def _stderr(message: str) -> None:
    print(f"edgekit: {message}", file=sys.stderr)


def patched(source: Source) -> Source:
    """``source`` with edgekit's llama.cpp patches applied: a copy in the cache, one per source tree.

    The copy keeps its path when the series changes (it is made anew beside it and swapped in), so the build
    directories and ccache see only the files the patches change: a changed series recompiles what it touches,
    not all of llama.cpp. Every file the old or the new series touches is a fresh file, younger than any object.
    """
    patches = series()
    if not patches or source.patches:
        return source
    ident = f"{source.identity}+patches:{series_id(patches)}"
    tree_dir = sources_dir() / f"patched-{hashlib.sha256(source.identity.encode()).hexdigest()[:16]}"
    old = _read_marker(tree_dir)
    if old is not None and old.get("identity") == ident and (cached := cached_tree(tree_dir)) is not None:
        return cached
    touched = sorted({f for p in patches for f in p.touched})
    fresh = set(touched) | set((old or {}).get("touched") or [])

    def copy_and_patch(tmp: Path) -> dict[str, Any]:
        link_tree(source.path, tmp / "llama.cpp", fresh)
        for name in fresh:  # younger than every object built from the previous series
            if (tmp / "llama.cpp" / name).exists():
                os.utime(tmp / "llama.cpp" / name)
        where = f"llama.cpp at {source.path}" + (f" (commit {source.commit[:7]})" if source.commit else "")
        return {"root": "llama.cpp", "identity": ident, "commit": source.commit, "origin": source.origin,
                "patches": apply_series(tmp / "llama.cpp", patches, where), "touched": touched,
                "unpatched": str(source.path)}

    return _make_tree(".patch-", tree_dir, copy_and_patch, replace=True)


def _swap(tmp: Path, final: Path) -> None:
    """Put a finished tree in place of the one at ``final`` (if any)."""
    if final.exists():
        stale = Path(tempfile.mkdtemp(prefix=".stale-", dir=final.parent))
        os.rename(final, stale / "tree")
        shutil.rmtree(stale, ignore_errors=True)
    _publish(tmp, final)


def resolve_source(src: str | os.PathLike[str] | None = None,
                   note: Callable[[str], None] = _stderr, patches: bool = True) -> Source:
    """The source tree for ``--src`` (a dir or tarball), else the pinned ref (cloned, or from the PyPI sdist),
    with edgekit's patches applied (``patches=False``: as it is)."""
    tree = _unpatched(src, note)
    return patched(tree) if patches else tree


def _unpatched(src: str | os.PathLike[str] | None, note: Callable[[str], None]) -> Source:
    if src is None:
        return _from_git_or_sdist(note)
    path = Path(src).expanduser()
    if not path.exists():
        raise EdgekitError(f"--src {path} does not exist.")
    path = path.resolve()
    if path.is_dir():
        return _from_dir(path)
    if tarfile.is_tarfile(path):
        return _from_tarball(path)
    raise EdgekitError(f"--src {path} is neither a directory nor a tarball.")


def ensure_source(src: str | os.PathLike[str] | None = None) -> Path:
    """Path of a llama.cpp tree (real path) — the stable entry point for build and convert."""
    return resolve_source(src).path


def fetch_sdist(dest: Path | None = None) -> Path:
    """The llama-cpp-python sdist (vendors the pinned llama.cpp), downloaded from PyPI once."""
    dest = dest or cache_dir() / "downloads" / "sdist"
    path = dest / SDIST_FILENAME
    if path.is_file() and _sha256(path) == SDIST_SHA256:
        return path
    pip_download([SDIST_REQUIREMENT], dest, ["--no-binary", ":all:"])
    if not path.is_file():
        raise EdgekitError(f"pip did not produce {SDIST_FILENAME} in {dest}.")
    if _sha256(path) != SDIST_SHA256:
        path.unlink()
        raise EdgekitError(f"{SDIST_FILENAME} from PyPI does not have the expected sha256; removed it.")
    return path


def cached_sdist() -> Path | None:
    """The sdist if it is already in the cache (tests use this to skip the network)."""
    path = cache_dir() / "downloads" / "sdist" / SDIST_FILENAME
    return path if path.is_file() else None
