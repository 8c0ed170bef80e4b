"""Binaries + the shared libraries they load, as one reproducible tarball (and back)."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import re
import shutil
import tarfile
import tempfile
from pathlib import Path
from typing import Any

from edgekit.build.elf import is_elf, section_bytes
from edgekit.build.patches import LIST_FILE, list_text
from edgekit.build.untar import extract_all
from edgekit.errors import EdgekitError
from edgekit.paths import cache_dir
from edgekit.store import Artifact, sha256_file

TARBALL = "llama.cpp.tar.gz"
LOG = "build.log"
_SONAME = re.compile(rb"lib[A-Za-z0-9_+.-]+?\.so(?:\.\d+)*")


def needed_libs(path: Path) -> set[str]:
    """Library names a file's dynamic string table mentions (DT_NEEDED and its own SONAME)."""
    return {m.decode() for m in _SONAME.findall(section_bytes(path, ".dynstr"))}


def collect(bin_dir: Path, binaries: tuple[str, ...], extra_libs: list[Path], out: Path) -> list[str]:
    """Copy the binaries and the shared libraries they need from ``bin_dir`` into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    missing = [b for b in binaries if not (bin_dir / b).is_file()]
    if missing:
        raise EdgekitError(f"The build did not produce {', '.join(missing)} in {bin_dir}.")
    todo = list(binaries)
    seen: set[str] = set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        src = bin_dir / name
        if src.is_symlink():  # keep libfoo.so.0 -> libfoo.so.0.0.1 as links, ship both
            target = os.readlink(src)
            (out / name).symlink_to(target)
            todo.append(target)
            continue
        shutil.copy2(src, out / name)
        todo += [lib for lib in needed_libs(src) if (bin_dir / lib).exists() and lib not in seen]
    for lib in extra_libs:
        shutil.copy2(lib.resolve(), out / lib.name)
        seen.add(lib.name)
    return sorted(seen)


def write_patch_list(files_dir: Path, patches: dict[str, str]) -> None:
    """Beside the binaries, which of edgekit's llama.cpp patches they were built with (the board's probe reads
    it from the release it serves)."""
    if patches:
        (files_dir / LIST_FILE).write_text(list_text(patches))


def _reset(info: tarfile.TarInfo) -> tarfile.TarInfo:
    # Same files → same bytes: no owners, no times.
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.mtime = 0
    return info


def make_tarball(files_dir: Path, tarball: Path) -> list[dict[str, Any]]:
    """Deterministic .tar.gz of ``files_dir`` as bin/...; returns name, sha256, size per file."""
    contents = []
    with open(tarball, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0,
                                                     compresslevel=6) as gz, \
            tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for path in sorted(files_dir.iterdir()):
            tf.add(path, arcname=f"bin/{path.name}", recursive=False, filter=_reset)
            if path.is_symlink():
                contents.append({"name": f"bin/{path.name}", "link": os.readlink(path)})
            else:
                contents.append({"name": f"bin/{path.name}", "sha256": sha256_file(path),
                                 "size": path.stat().st_size, "elf": is_elf(path)})
    return contents


def unpacked(artifact: Artifact) -> Path:
    """The artifact's bin/ unpacked once under the cache and checked against the manifest."""
    dest = cache_dir() / "unpacked" / f"{artifact.kind}-{artifact.key[:16]}"
    stamp = dest / ".complete"
    if stamp.is_file():
        return dest / "bin"
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".unpack-", dir=dest.parent))
    try:
        with tarfile.open(artifact.file(TARBALL)) as tf:
            extract_all(tf, tmp, "tar")
        for entry in artifact.manifest.get("contents", []):
            if "sha256" in entry and sha256_file(tmp / entry["name"]) != entry["sha256"]:
                raise EdgekitError(f"{entry['name']} in artifact {artifact.key[:12]} does not match its sha256.")
        (tmp / ".complete").write_text(json.dumps({"key": artifact.key}))
        if dest.exists():
            shutil.rmtree(dest)
        os.rename(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dest / "bin"


def tree_digest(contents: list[dict[str, Any]]) -> str:
    """One hash over the shipped files (names, links and sha256s): equal builds, equal digest."""
    return hashlib.sha256(json.dumps(contents, sort_keys=True).encode()).hexdigest()

