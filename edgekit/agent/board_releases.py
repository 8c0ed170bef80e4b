"""The board's release layout, as the board itself changes it (the activation program's half of
edgekit.remote.releases; same layout, same order, same atomic steps):

    store/<sha256>             content-addressed blobs
    agent/edgekit-agent-<hash>.pyz   the agent zipapps edgekit sent (edgekit.remote.agent_ship)
    releases/<id>/...          hard links to blobs: bin/, lib/, models/, release.json, the units; and
                               edgekit-agent.pyz, a hard link to the agent that made it
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
import time
from typing import Any

_SHA = re.compile(r"^[0-9a-f]{64}$")
_AGENT = re.compile(r"^edgekit-agent-[0-9a-f]{16}\.pyz$")
AGENT_LINK = "edgekit-agent.pyz"  # in a release: which agent made it (keeps that zipapp through a prune)


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

    def create(self, rid: str, pairs: list[tuple[str, str]], agent: str | None = None) -> bool:
        """releases/<rid> made of hard links to store/<sha> (built as releases/.<rid>.tmp and renamed into place);
        False when it was there already. One process: as a shell script it spent a fork on every file's dirname,
        mkdir and ln (≈ 100 for a release, a tenth of a second of a board's CPU). ``agent``: the zipapp running
        this, linked in too, so a prune keeps it as long as the release."""
        final = self.path("releases", rid)
        if os.path.isdir(final):
            return False
        tmp = self.path("releases", "." + rid + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(self.path("logs"), exist_ok=True)
        os.makedirs(tmp)
        for rel, sha in pairs:
            dst = os.path.join(tmp, rel)
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            os.link(self.path("store", sha), dst)
        if agent and _AGENT.match(os.path.basename(agent)) and os.path.isfile(agent):
            os.link(agent, os.path.join(tmp, AGENT_LINK))
        os.rename(tmp, final)
        return True

    def pin(self, rid: str, shas: list[str]) -> None:
        """Hard links under pushed/<rid>, so the prune of a later deploy (which drops store blobs no release links)
        keeps what `edgekit push` sent. One pushed release at a time: a newer push replaces an older one's pins."""
        tmp = self.path("pushed.tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(os.path.join(tmp, rid))
        for sha in shas:
            os.link(self.path("store", sha), os.path.join(tmp, rid, sha))
        shutil.rmtree(self.path("pushed"), ignore_errors=True)
        os.rename(tmp, self.path("pushed"))

    def listing(self) -> dict[str, Any]:
        """current, serving, current's last health record and the releases, oldest first."""
        cur = self.current
        return {"current": cur, "serving": self.serving, "health": self.health(cur) if cur else None,
                "releases": self.releases()}

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
        self._prune_agents()
        return removed

    def _prune_agents(self) -> None:
        """Agent zipapps no release links any more go with the releases that used them; one sent within the hour
        stays (a command of its edgekit may be using it). A later command sends its edgekit's agent again if the
        board lacks it."""
        try:
            names = os.listdir(self.path("agent"))
        except OSError:
            return
        for name in names:
            full = self.path("agent", name)
            st = os.stat(full)
            if _AGENT.match(name) and os.path.isfile(full) and st.st_nlink == 1 and time.time() - st.st_mtime > 3600:
                os.unlink(full)
