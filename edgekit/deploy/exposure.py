"""What a deploy or rollback says about the address a board's server listens on.

Today's recipes serve on the board's loopback (edgekit.config.serve_address); releases an earlier edgekit
made may listen on 0.0.0.0 with no key. A deploy that replaces one says so; a rollback to one warns.
"""

from __future__ import annotations

from edgekit.config.serve_address import LOOPBACK_HOST, is_loopback
from edgekit.release.manifest import ReleaseManifest
from edgekit.remote import releases
from edgekit.remote.runner import LocalRunner, SshRunner

Runner = SshRunner | LocalRunner


def open_address(runner: Runner, base: str, release_id: str) -> str | None:
    """The network address ``release_id`` serves on with no key, or None (loopback, a key, or unknown)."""
    data = releases.read_manifest(runner, base, release_id)
    manifest = ReleaseManifest.of({"release": release_id, "recipe": "", **data})
    host = manifest.served_host
    return None if host is None or is_loopback(host) or manifest.api_key_file else host


def after_deploy(runner: Runner, base: str, previous: str | None, now: ReleaseManifest) -> list[str]:
    """The deploy moved the board from an open address to its loopback or behind a key: one sentence saying so."""
    host = open_address(runner, base, previous) if previous else None
    if host is None:
        return []
    where = (f"on {now.served_host}, to clients that send its key" if now.api_key_file
             else f"on the board's loopback only ({LOOPBACK_HOST})")
    return [f"The previous release ({previous}) served on {host} with no key, to any machine that reaches the "
            f"board; this one serves {where}."]


def after_rollback(runner: Runner, base: str, release_id: str) -> list[str]:
    """Rolled back to a release an earlier edgekit made open to the network: one sentence warning of it."""
    host = open_address(runner, base, release_id)
    if host is None:
        return []
    return [f"Release {release_id} serves on {host} with no key, to any machine that reaches the board; "
            f"deploy a current recipe to serve on the board's loopback ({LOOPBACK_HOST}) again."]
