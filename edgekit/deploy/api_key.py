"""A board's API key (``runtime.auth: key``): put on the board before a release that asks for it starts, and
replaced (``edgekit board key rotate``) with no request refused for longer than the server's restart.

The workstation keeps each board's key (edgekit.config.api_keys); the board keeps it in a 0600 file its
server reads as it starts (edgekit.remote.board_key). A rotation's new key is saved beside the old one
first, so an edgekit killed half way still holds the key the board may already have.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from edgekit.config import api_keys
from edgekit.deploy.health import wait_ready
from edgekit.deploy.service import Service
from edgekit.engines import get_engine
from edgekit.errors import EdgekitError
from edgekit.release.manifest import ReleaseManifest
from edgekit.release.units import UNIT_NAME
from edgekit.remote import board_key, releases
from edgekit.remote.http import request
from edgekit.remote.runner import LocalRunner, SshRunner

Runner = SshRunner | LocalRunner


def key_envs(engine: str) -> list[str]:
    """The environment variables an engine's server reads the key from (none: it takes the key file)."""
    name = get_engine(engine).key_env
    return [name] if name else []


def install(runner: Runner, base: str, board: str, engine: str) -> None:
    """The workstation's key for ``board`` onto the board (made here the first time), as ``engine`` reads it."""
    board_key.place(runner, base, key_for(runner, base, board), key_envs(engine))


def key_for(runner: Runner, base: str, board: str) -> str:
    """The key ``board`` is to hold: the workstation's, made here the first time; an error when the board holds
    one this workstation lacks (asked before anything is built or sent)."""
    key = api_keys.read_key(board)
    if key is None:
        if board_key.placed(runner, base):
            raise EdgekitError(
                f"Board {board!r} already holds an API key that this workstation does not have "
                f"({api_keys.key_file(board)}); copy that file here (mode 0600) from the workstation that "
                f"deployed it, or replace the board's key with `edgekit board key rotate --board {board}`.")
        key = api_keys.make_key(board)
    return key


def usage_note(board: str) -> str:
    return (f"clients of {board} send the key in {api_keys.key_file(board)} as `Authorization: Bearer <key>` "
            "(every request but /health)")


@dataclass
class Rotation:
    board: str
    release: str
    key_file: str
    seconds_unserved: float  # from the restart until /health answered again

    def to_dict(self) -> dict[str, object]:
        return dict(self.__dict__)


def _answers(runner: Runner, port: int, path: str, key: str | None) -> int:
    return request(runner, port, "GET", path, timeout=30, api_key=key).status


def rotate(runner: Runner, base: str, board: str, sudo: Sequence[str], timeout: float = 180.0) -> Rotation:
    """A new key on the board and here; the service restarted on it; the old key refused, the new one taken."""
    lay = releases.layout(runner, base)
    if lay.current is None:
        raise EdgekitError(f"Board {board!r} serves no release; its key is made by the first deploy that asks "
                           "for one (runtime.auth: key).")
    manifest = ReleaseManifest.read(releases.read_manifest(runner, base, lay.current),
                                    f"release {lay.current} on board {board!r}")
    if not manifest.api_key_file:
        raise EdgekitError(f"Board {board!r} serves release {lay.current}, which asks for no key; set "
                           "runtime.auth: key in its recipe and deploy.")
    old, new = api_keys.read_key(board), api_keys.new_key()
    api_keys.save_key(board, new, suffix=".new")  # kept until the board has it and answers to it
    board_key.place(runner, base, new, key_envs(manifest.engine))
    t = time.monotonic()
    Service(runner, UNIT_NAME, sudo).restart()
    try:
        wait_ready(runner, manifest.port, timeout)
    except TimeoutError as exc:
        raise EdgekitError(f"Board {board!r} did not serve again after its key was replaced ({exc}); the new key "
                           f"is in {api_keys.key_file(board)}.new.") from None
    unserved = time.monotonic() - t
    path = get_engine(manifest.engine).key_probe_path
    if _answers(runner, manifest.port, path, new) != 200:
        raise EdgekitError(f"Board {board!r} refuses its new key on {path}; it is in "
                           f"{api_keys.key_file(board)}.new.")
    if old and _answers(runner, manifest.port, path, old) == 200:
        raise EdgekitError(f"Board {board!r} still takes its old key after the restart; the new one is in "
                           f"{api_keys.key_file(board)}.new.")
    saved = api_keys.save_key(board, new)
    api_keys.key_file(board).with_name(f"{board}.key.new").unlink(missing_ok=True)
    return Rotation(board, lay.current, str(saved), round(unserved, 2))
