"""The board's release layout, as the board itself changes it (the activation program's half of
edgekit.remote.releases; same layout, same order, same atomic steps):

    store/<sha256>             content-addressed blobs
    releases/<id>/...          hard links to blobs: bin/, lib/, models/, release.json, the units
    current -> releases/<id>   the last release that passed its health check (switched with one rename)
    serving                    the id of the release the service was last started from
    pushed/<id>/<sha>          pins of a pushed, not yet activated release (edgekit push)

Releases are ordered oldest first by directory mtime, ties by id (C collation), as remote.releases.layout
orders them. Standard library only (Python 3.8).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from typing import Any

_SHA = re.compile(r"^[0-9a-f]{64}$")


class Layout:
    def __init__(self, base: str) -> None:
        self.base = base.rstrip("/") or "/"

    def path(self, *parts: str) -> str:
        return os.path.join(self.base, *parts)

    @property
    def current(self) -> str | None:
        try:
            link = os.readlink(self.path("current"))
        except OSError:
            return None
        return link[len("releases/"):] if link.startswith("releases/") else link

    @property
    def serving(self) -> str | None:
        try:
            with open(self.path("serving")) as fh:
                return fh.read().strip() or None
        except OSError:
            return None

    def releases(self) -> list[str]:
        """Oldest first: (mtime in whole seconds, id)."""
        found = []
        try:
            names = os.listdir(self.path("releases"))
        except OSError:
            return []
        for name in names:
            full = self.path("releases", name)
            if not name.startswith(".") and os.path.isdir(full):
                found.append((int(os.stat(full).st_mtime), name))
        return [name for _, name in sorted(found)]

    def previous(self) -> str | None:
        ids, cur = self.releases(), self.current
        return ids[ids.index(cur) - 1] if cur in ids and ids.index(cur) > 0 else None

    def health(self, rid: str) -> dict[str, Any] | None:
        try:
            with open(self.path("releases", rid, "health.json")) as fh:
                data = json.load(fh)
        except (OSError, ValueError):
            return None  # none yet, or a torn record: the next full check writes it again
        return data if isinstance(data, dict) else None

    def _replace_text(self, path: str, text: str) -> None:
        tmp = os.path.join(os.path.dirname(path), "." + os.path.basename(path) + ".new")
        with open(tmp, "w") as fh:
            fh.write(text)
        os.replace(tmp, path)

    def switch(self, rid: str) -> None:
        """Point current at releases/<rid> with one rename(2)."""
        if not os.path.isdir(self.path("releases", rid)):
            raise FileNotFoundError("no release " + rid)
        tmp = self.path(".current.new")
        if os.path.lexists(tmp):
            os.unlink(tmp)
        os.symlink("releases/" + rid, tmp)
        os.replace(tmp, self.path("current"))

    def mark_serving(self, rid: str) -> None:
        self._replace_text(self.path("serving"), rid + "\n")

    def record_health(self, rid: str, health: dict[str, Any]) -> None:
        self._replace_text(self.path("releases", rid, "health.json"), json.dumps(health, sort_keys=True) + "\n")

    def prune(self, keep: int, protect: list[str]) -> list[str]:
        """Remove all but the newest ``keep`` releases (never one in ``protect``), printing order oldest first;
        drop a pushed release's pins once the release exists; delete blobs no release links any more."""
        if keep < 1:
            raise ValueError(f"keep at least one release, not {keep}")
        ids = self.releases()
        removed = [rid for rid in ids[:max(0, len(ids) - keep)] if rid not in protect]
        for rid in removed:
            shutil.rmtree(self.path("releases", rid))
        try:
            pushed = os.listdir(self.path("pushed"))
        except OSError:
            pushed = []
        for rid in pushed:
            if os.path.isdir(self.path("pushed", rid)) and os.path.isdir(self.path("releases", rid)):
                shutil.rmtree(self.path("pushed", rid))
        try:
            blobs = os.listdir(self.path("store"))
        except OSError:
            blobs = []
        for name in blobs:  # an upload's <sha>.part never matches
            full = self.path("store", name)
            if _SHA.match(name) and os.path.isfile(full) and not os.path.islink(full) and os.stat(full).st_nlink == 1:
                os.unlink(full)
        return removed
