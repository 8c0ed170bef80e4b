"""`verify-store`: every blob of a board's store hashed again, and which releases hold a corrupt one.

    verify-store BASE [--repair]

A disk that rots changes neither a file's size nor its mtime: only a full sha256 tells. A blob whose sha256 is not
its name is reported with the releases that hold it (their files are hard links: the same inode, the same bad
bytes). ``--repair``: a bad blob no current release holds is deleted (the next push sends it anew), and every
release that is not current and holds one is removed (the next deploy of it makes it again from the mended store).
A bad blob the *current* release holds is kept, and so is that release, which the service runs: roll back from it
(``edgekit rollback``), and the next deploy of it re-hashes its store before it activates it, drops it and makes it
anew. Standard library only (Python 3.8).
"""

from __future__ import annotations

import os
import shutil
import time
from typing import Any

from .blobstore import hash_file, is_sha
from .board_releases import Layout


def _holders(lay: Layout, inodes: dict[tuple[int, int], str]) -> dict[str, dict[str, list[str]]]:
    """sha → release id → its files that are that blob (by device and inode)."""
    out: dict[str, dict[str, list[str]]] = {}
    for rid in lay.releases():
        root = lay.path("releases", rid)
        for folder, _dirs, files in os.walk(root):
            for name in files:
                path = os.path.join(folder, name)
                try:
                    st = os.lstat(path)
                except OSError:
                    continue
                sha = inodes.get((st.st_dev, st.st_ino))
                if sha is not None:
                    out.setdefault(sha, {}).setdefault(rid, []).append(os.path.relpath(path, root))
    return out


def verify(base: str, repair: bool = False) -> dict[str, Any]:
    start = time.monotonic()
    lay = Layout(base)
    store = lay.path("store")
    try:
        names = sorted(n for n in os.listdir(store) if is_sha(n) and os.path.isfile(os.path.join(store, n)))
    except FileNotFoundError:
        names = []
    size, bad = 0, []
    for sha in names:
        path = os.path.join(store, sha)
        size += os.path.getsize(path)
        if hash_file(path) != sha:
            bad.append(sha)
    inodes = {}
    for sha in bad:
        st = os.stat(os.path.join(store, sha))
        inodes[(st.st_dev, st.st_ino)] = sha
    held = _holders(lay, inodes) if bad else {}
    current = lay.current
    report, dropped = [], []
    for sha in bad:
        releases = held.get(sha, {})
        serving = current in releases
        deleted = False
        if repair and not serving:
            os.unlink(os.path.join(store, sha))
            deleted = True
        report.append({"sha256": sha, "releases": releases, "current_holds_it": serving, "deleted": deleted})
        if repair:
            for rid in releases:
                if rid != current and rid not in dropped and os.path.isdir(lay.path("releases", rid)):
                    shutil.rmtree(lay.path("releases", rid))
                    dropped.append(rid)
    return {"store": store, "checked": len(names), "bytes": size, "seconds": round(time.monotonic() - start, 3),
            "bad": report, "current": current, "current_corrupt": any(b["current_holds_it"] for b in report),
            "repaired": repair, "releases_dropped": sorted(dropped)}
