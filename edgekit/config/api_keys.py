"""The API keys of boards whose server asks for one (``runtime.auth: key``), kept on the workstation.

One key per board, made here with the OS's random source, in ``<config dir>/keys/<board>.key`` (the
directory 0700, the file 0600). A key is written to a new file and renamed into place, so a reader sees the
old key or the new one, never half of either. The key never goes on a command line, into release.json, a
result, a report or a log: edgekit reads it from here when a client on the workstation needs it.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from edgekit.agent.keyfile import MIN_KEY_CHARS, key_problem
from edgekit.config.names import require_name
from edgekit.errors import EdgekitError
from edgekit.paths import config_dir

KEY_BYTES = 32  # 256 bits, URL-safe base64: no character a header or an environment file would mangle
# 43 characters, more than the MIN_KEY_CHARS (32) a board's server starts with (edgekit.agent.keyfile): a key
# shorter than that, or with a character that is not printable ASCII, is neither saved nor read here.


def keys_dir() -> Path:
    return config_dir() / "keys"


def key_file(board: str) -> Path:
    return keys_dir() / f"{require_name(board, 'board name')}.key"


def new_key() -> str:
    return secrets.token_urlsafe(KEY_BYTES)


def read_key(board: str) -> str | None:
    """The board's key, or None when edgekit made it none yet."""
    path = key_file(board)
    try:
        text = path.read_text().strip()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise EdgekitError(f"Cannot read board {board!r}'s API key at {path}: {exc.strerror}.") from None
    if not text:
        raise EdgekitError(f"Board {board!r}'s API key file {path} is empty; remove it and deploy again.")
    problem = key_problem(text)
    if problem is not None:
        raise EdgekitError(f"Board {board!r}'s API key in {path} {problem} (a key is at least "
                           f"{MIN_KEY_CHARS} printable ASCII characters); remove it and replace the board's key with "
                           f"`edgekit board key rotate --board {board}`.")
    return text


def save_key(board: str, key: str, suffix: str = "") -> Path:
    """``key`` as the board's (``suffix``: a file beside it, e.g. a rotation's new key not yet on the board);
    refused, with nothing written, when it is no key a board's server would start with."""
    problem = key_problem(key)
    if problem is not None:
        raise EdgekitError(f"Refusing to save this API key for board {board!r}: the key {problem} "
                           f"(a key is at least {MIN_KEY_CHARS} printable ASCII characters).")
    folder = keys_dir()
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o700)
    final = key_file(board).with_name(f"{board}.key{suffix}")
    tmp = final.with_name(f".{final.name}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(key + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, final)
    return final


def make_key(board: str) -> str:
    """A new key, saved as the board's (the first time a release that asks for one goes to it)."""
    key = new_key()
    save_key(board, key)
    return key
