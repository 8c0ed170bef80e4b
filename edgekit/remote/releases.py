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
from edgekit.remote.runner import LocalRunner, SshRunner

Runner = SshRunner | LocalRunner
_ID = re.compile(r"^[0-9A-Za-z][0-9A-Za-z._-]{0,80}$")
_REL = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._+-]*(/[A-Za-z0-9_][A-Za-z0-9._+-]*)*$")
_SHA = re.compile(r"^[0-9a-f]{64}$")

# `python3 -c CREATE_PY BASE ID [PATH SHA]...`: releases/<ID> made of hard links to store/<SHA>, built as
# releases/.<ID>.tmp and renamed into place; prints `created`, or `exists` when it was there already.
# One process: as a shell script it spent a fork on every file's dirname, mkdir and ln (≈ 100 for a
# release, a tenth of a second of a board's CPU).
CREATE_PY = r"""
import os, shutil, sys

base, rid, pairs = sys.argv[1], sys.argv[2], sys.argv[3:]
final = os.path.join(base, "releases", rid)
if os.path.isdir(final):
    print("exists")
    sys.exit(0)
tmp = os.path.join(base, "releases", "." + rid + ".tmp")
shutil.rmtree(tmp, ignore_errors=True)
os.makedirs(os.path.join(base, "logs"), exist_ok=True)
os.makedirs(tmp)
for i in range(0, len(pairs) - 1, 2):
    dst = os.path.join(tmp, pairs[i])
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    os.link(os.path.join(base, "store", pairs[i + 1]), dst)
os.rename(tmp, final)
print("created")
"""

# "$1" base, "$2" id: point current at releases/<id> with one rename(2). The board's program does this itself
# (agent/board_releases.py); the fleet's rescue of a program that did not finish uses this.
SWITCH_SH = r"""
set -eu
[ -d "$1/releases/$2" ] || { echo "no release $2" >&2; exit 3; }
ln -sfn "releases/$2" "$1/.current.new"
mv -T "$1/.current.new" "$1/current"
"""

# "$1" base: current, serving, then one line per release "<mtime> <id>".
LIST_SH = r"""
base="$1"
printf 'current=%s\n' "$(readlink "$base/current" 2>/dev/null | sed 's#^releases/##')"
printf 'serving=%s\n' "$(cat "$base/serving" 2>/dev/null)"
printf 'health=%s\n' "$(tr -d '\n' < "$base/current/health.json" 2>/dev/null)"
for d in "$base"/releases/*/; do
  [ -d "$d" ] || continue
  id="$(basename "$d")"
  printf 'release=%s %s\n' "$(stat -c %Y "$d")" "$id"
done
"""

# "$1" base, "$2" release id, then its blobs' sha256: hard links under pushed/<id>, so the prune of a later
# deploy (which drops store blobs no release links) keeps what `edgekit push` sent. One pushed release at a time:
# a newer push replaces the pins of an older one.
PIN_SH = r"""
set -eu
base="$1"; rid="$2"; shift 2
rm -rf "$base/pushed.tmp"
mkdir -p "$base/pushed.tmp/$rid"
for sha in "$@"; do ln -f "$base/store/$sha" "$base/pushed.tmp/$rid/$sha"; done
rm -rf "$base/pushed"
mv "$base/pushed.tmp" "$base/pushed"
"""


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
    """Make releases/<id> from blobs already in the store; False when it already existed."""
    argv = ["python3", "-c", CREATE_PY, base, check_id(release_id)]
    for rel, sha in sorted(files.items()):
        if not _REL.match(rel) or ".." in rel.split("/"):
            raise EdgekitError(f"{rel!r} is not a safe path inside a release.")
        if not _SHA.match(sha):
            raise EdgekitError(f"{sha!r} is not a sha256.")
        argv += [rel, sha]
    out = runner.run(argv, timeout=120).stdout.strip()
    return out.endswith("created")


def pin(runner: Runner, base: str, release_id: str, shas: list[str]) -> None:
    """Keep a pushed, not yet activated release's blobs through other deploys' prunes (PIN_SH)."""
    bad = [s for s in shas if not _SHA.match(s)]
    if bad:
        raise EdgekitError(f"{bad[0]!r} is not a sha256.")
    runner.run(["sh", "-c", PIN_SH, "edgekit-pin", base, check_id(release_id), *sorted(set(shas))], timeout=120)


def layout(runner: Runner, base: str) -> Layout:
    out = runner.run(["sh", "-c", LIST_SH, "edgekit-list", base], timeout=30).stdout
    current = serving = health = None
    releases: list[tuple[int, str]] = []
    for line in out.splitlines():
        key, _, value = line.partition("=")
        if key == "health" and value.strip():
            try:
                health = json.loads(value)
            except ValueError:
                health = None  # a torn record: the next full check writes it again
        elif key == "current":
            current = value.strip() or None
        elif key == "serving":
            serving = value.strip() or None
        elif key == "release":
            mtime, _, rid = value.partition(" ")
            releases.append((int(mtime), rid))
    return Layout(current, serving, [rid for _, rid in sorted(releases)], health if isinstance(health, dict) else None)


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
