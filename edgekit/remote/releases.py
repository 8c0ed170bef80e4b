"""The board's release layout under <base>:

    store/<sha256>          content-addressed blobs (pushed by transfer.py)
    releases/<id>/...       hard links to blobs: bin/, lib/, models/, release.json, the unit
    current -> releases/<id>   the last release that passed its health check (switched atomically)
    serving                 the id of the release the service was last started from
    logs/                   server logs

Hard links (not symlinks) keep `$ORIGIN` rpaths working: a binary's libraries sit beside it in
the release, and the blob's link count tells which blobs no release uses any more.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass

from edgekit.errors import EdgekitError
from edgekit.remote import agent_call
from edgekit.remote.runner import LocalRunner, SshRunner

Runner = SshRunner | LocalRunner
_ID = re.compile(r"^[0-9A-Za-z][0-9A-Za-z._-]{0,80}$")
_REL = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._+-]*(/[A-Za-z0-9_][A-Za-z0-9._+-]*)*$")
_SHA = re.compile(r"^[0-9a-f]{64}$")


def check_id(release_id: str) -> str:
    if not _ID.match(release_id) or ".." in release_id:
        raise EdgekitError(f"{release_id!r} is not a release id.")
    return release_id


@dataclass
class Layout:
    current: str | None
    serving: str | None
    releases: list[str]  # oldest first
    health: dict | None = None  # what current's last full health check found (health.json)

    def previous(self) -> str | None:
        """The newest release older than current (what `rollback` switches to)."""
        if self.current not in self.releases:
            return None
        idx = self.releases.index(self.current)
        return self.releases[idx - 1] if idx > 0 else None


def create(runner: Runner, base: str, release_id: str, files: Mapping[str, str]) -> bool:
    """Make releases/<id> from blobs already in the store (the agent's release-create); False when it already
    existed."""
    args = [base, check_id(release_id)]
    for rel, sha in sorted(files.items()):
        if not _REL.match(rel) or ".." in rel.split("/"):
            raise EdgekitError(f"{rel!r} is not a safe path inside a release.")
        if not _SHA.match(sha):
            raise EdgekitError(f"{sha!r} is not a sha256.")
        args += [rel, sha]
    got = agent_call.call(runner, base, "release-create", *args, timeout=120,
                          doing=f"Making release {release_id}")
    return bool(got.get("created"))


def pin(runner: Runner, base: str, release_id: str, shas: list[str]) -> None:
    """Keep a pushed, not yet activated release's blobs through other deploys' prunes (the agent's release-pin:
    hard links under pushed/<id>; one pushed release at a time)."""
    bad = [s for s in shas if not _SHA.match(s)]
    if bad:
        raise EdgekitError(f"{bad[0]!r} is not a sha256.")
    agent_call.call(runner, base, "release-pin", base, check_id(release_id), *sorted(set(shas)), timeout=120,
                    doing=f"Pinning release {release_id}")


def layout(runner: Runner, base: str) -> Layout:
    """The board's releases as the agent reads them (agent/board_releases.py: the order the activation prunes in)."""
    got = agent_call.call(runner, base, "release-list", base, timeout=30, doing="Reading the releases")
    health = got.get("health")
    return Layout(got.get("current") or None, got.get("serving") or None, [str(r) for r in got.get("releases") or []],
                  health if isinstance(health, dict) else None)


def read_manifest(runner: Runner, base: str, release_id: str) -> dict:
    res = runner.run(["cat", f"{base}/releases/{check_id(release_id)}/release.json"], check=False, timeout=30)
    try:
        return json.loads(res.stdout) if res.ok else {}
    except ValueError:
        return {}


def read_watchdog(runner: Runner, base: str) -> dict | None:
    """What the board's watchdog did (agent/watchdog.py's record): its restarts, last failure, a rollback."""
    res = runner.run(["cat", f"{base}/watchdog.json"], check=False, timeout=30)
    try:
        data = json.loads(res.stdout) if res.ok else None
    except ValueError:
        return None
    return data if isinstance(data, dict) else None
