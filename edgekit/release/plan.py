"""Compose a release on the workstation: which blobs go where, and the release's id.

The id is a hash of everything that defines what the board will run (blobs, server arguments,
recipe runtime), so deploying the same thing twice yields the same id and no new release.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgekit.agent.units import UNITS_FILE
from edgekit.build.memo import remember
from edgekit.config.recipes import Runtime
from edgekit.release.manifest import ReleaseManifest
from edgekit.release.units import (
    CANDIDATE_UNIT,
    UNIT_NAME,
    WATCHDOG_LOG_NAME,
    WATCHDOG_UNIT,
    service_log,
    unit_spec,
    watchdog_argv,
)
from edgekit.remote.transfer import Blob
from edgekit.store import canonical_json, sha256_file


@dataclass
class ReleasePlan:
    release_id: str
    files: dict[str, Blob]  # path inside the release → blob
    manifest: dict[str, Any]
    _tmp: tempfile.TemporaryDirectory | None = field(default=None, repr=False)

    @property
    def blobs(self) -> list[Blob]:
        unique = {b.sha256: b for b in self.files.values()}
        return [unique[k] for k in sorted(unique)]

    @property
    def payload_bytes(self) -> int:
        return sum(b.size for b in self.blobs)

    def file_shas(self) -> dict[str, str]:
        return {rel: b.sha256 for rel, b in self.files.items()}

    @property
    def typed(self) -> ReleaseManifest:
        """The manifest (release.json) as every reader sees it."""
        return ReleaseManifest.of(self.manifest)


def service_ports(board_port: int | None, recipe_port: int) -> tuple[int, int]:
    """(main, candidate): the board's service port (else the recipe's) and the one beside it."""
    port = board_port or recipe_port
    return port, port + 1 if port < 65535 else port - 1


def service_units(base: str, rid: str, argv_at: Callable[[str, int], list[str]], ports: tuple[int, int],
                  runtime: Runtime, environment: dict[str, str] | None = None, env_file: str | None = None,
                  key_file: str | None = None, user: str | None = None,
                  writable_at: Callable[[str, int], list[str]] | None = None) -> dict[str, str]:
    """The release's units as ``units.json`` (their specs, by name): the main and candidate server (``argv_at(release
    dir, port)``) on two ports, each logging where activation reads it, and the watchdog's, unless the recipe turns
    it off (activation then removes a watchdog an earlier one left). ``user``: all three run as that user
    (BoardFacts.service_user); ``writable_at(release dir, port)``: what the engine's server writes besides its log
    (``hardening: strict``); ``key_file``: checked before the server starts."""

    rdir = f"{base}/releases/{rid}"
    main, candidate = ports
    hardening = runtime.hardening
    env = runtime.env if environment is None else environment
    writable = writable_at or (lambda _rdir, _port: [])

    def server(unit: str, role: str, port: int, log: str) -> dict[str, object]:
        return unit_spec(unit, role, base, rid, argv_at(rdir, port), log, user, env, env_file, key_file,
                         hardening=hardening, writable=writable(rdir, port))

    specs = {} if not runtime.watchdog.enabled else {
        WATCHDOG_UNIT: unit_spec(WATCHDOG_UNIT, "watchdog", base, rid,
                                 watchdog_argv(base, rid, main, **runtime.watchdog.model_dump(exclude={"enabled"})),
                                 f"{base}/logs/{WATCHDOG_LOG_NAME}", user, restart="always", hardening=hardening,
                                 writable=[base])}
    specs[UNIT_NAME] = server(UNIT_NAME, "server", main, service_log(base))
    specs[CANDIDATE_UNIT] = server(CANDIDATE_UNIT, "candidate", candidate, service_log(base, candidate=True))
    return {UNITS_FILE: json.dumps(specs, indent=2, sort_keys=True) + "\n"}


def agent_files() -> dict[str, Path]:
    """The board-side agent (stdlib only): it travels with every release, whatever the engine."""
    agent = Path(__file__).resolve().parents[1] / "agent"
    return {f"agent/{p.name}": p for p in sorted(agent.glob("*.py"))} if agent.is_dir() else {}


# Files this big are hashed once per (path, size, mtime), not on every deploy: the models and
# libraries come from the store, which never rewrites a file. Small ones (units, the agent) are hashed
# each time, which costs less than remembering them. The board checks every byte it receives anyway.
_REMEMBER_SHA_FROM = 1 << 20


def blob_for(path: Path, executable: bool = False) -> Blob:
    size = path.stat().st_size
    sha = remember("sha256", path, lambda: sha256_file(path)) if size >= _REMEMBER_SHA_FROM else sha256_file(path)
    return Blob(sha, size, path, executable)


def plan_release(
    recipe_name: str,
    files_in: dict[str, Path],
    describe: dict[str, Any],
    render: Callable[[str], dict[str, str]] | None = None,
) -> ReleasePlan:
    """Blobs for bin/, lib/, models/ (``files_in``: path in release → local file), the id and manifest.

    ``describe`` carries what is not a file but changes what runs (server args, runtime settings,
    artifact keys); it goes into the manifest and into the id. ``render(release_id)`` makes small
    text files that depend on the id (the unit names the release directory); they are a function
    of what the id already covers, so they stay out of the hash.
    """
    files: dict[str, Blob] = {
        rel: blob_for(path, executable=rel.startswith("bin/")) for rel, path in files_in.items()
    }
    content = {rel: b.sha256 for rel, b in sorted(files.items())}
    ident = hashlib.sha256(canonical_json({"files": content, "describe": describe}).encode()).hexdigest()
    release_id = f"{recipe_name}-{ident[:12]}"
    tmp = tempfile.TemporaryDirectory(prefix="edgekit-release-")
    for rel, text in (render(release_id) if render else {}).items():
        local = Path(tmp.name) / rel.replace("/", "__")
        local.write_text(text)
        files[rel] = blob_for(local, executable=rel.startswith("bin/"))
    manifest = {"release": release_id, "recipe": recipe_name, "files": {
        rel: {"sha256": b.sha256, "size": b.size} for rel, b in sorted(files.items())}, **describe}
    # release.json itself is a blob too, so the board carries its own description.
    rel_json = Path(tmp.name) / "release.json"
    rel_json.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    files["release.json"] = blob_for(rel_json)
    return ReleasePlan(release_id, files, manifest, tmp)
