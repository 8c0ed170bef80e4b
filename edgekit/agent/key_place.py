"""`key-place BASE [--env NAME]…`: a board's API key, read from stdin (never an argument: a command line is visible
to every user of the board), into ``BASE/keys/api.key`` (the key: a server that takes a key file, edgekit's checks)
and, for each ``--env NAME`` (a server that reads its key from an environment variable: the engine names it),
``BASE/keys/NAME.env`` (``NAME=…``, which that server's unit reads as its environment file). Every other ``*.env``
already there (a release made before keeps reading its own) is rewritten with the new key under its own names, so
a rotation leaves no file with the old one. Each file 0600 in a 0700 directory, written beside the old one, fsynced
and renamed over it: a server (re)started meanwhile reads the old key or the new one, never a part. Refused, before
anything is written, when it is no key the board's servers would start with (keyfile.key_problem), or a name is no
environment variable's. Standard library only (Python 3.8).
"""

from __future__ import annotations

import os
import re
from typing import Any, Sequence

from .keyfile import MAX_KEY_BYTES, MIN_KEY_CHARS, key_problem

KEY_NAME, ENV_SUFFIX = "api.key", ".env"
ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")


class KeyRefused(ValueError):
    """Not a key the board's servers would start with: one sentence, with no part of the key in it."""


def _write_private(path: str, text: str) -> None:
    tmp = os.path.join(os.path.dirname(path), "." + os.path.basename(path) + ".new")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)  # an earlier .new with other bits keeps them through O_CREAT
        os.write(fd, text.encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def _names_in(path: str) -> list:
    """The variable names an environment file of ours sets (``NAME=value`` lines)."""
    with open(path) as f:
        found = [line.split("=", 1)[0].strip() for line in f if "=" in line and not line.lstrip().startswith("#")]
    return [n for n in found if ENV_NAME_RE.fullmatch(n)]


def place(base: str, raw: bytes, env_names: Sequence[str] = ()) -> dict[str, Any]:
    bad = [n for n in env_names if not ENV_NAME_RE.fullmatch(n)]
    if bad:
        raise KeyRefused(f"refusing to place the API key under {bad[0]!r}: that is no environment variable's name")
    if len(raw) > MAX_KEY_BYTES:
        raise KeyRefused("refusing this API key: what came on stdin is longer than any key")
    try:
        key = raw.decode("ascii").strip()
    except UnicodeDecodeError:
        key = "\x00"  # key_problem names it: a non-printable character
    problem = key_problem(key)
    if problem is not None:
        raise KeyRefused(f"refusing this API key: the key {problem} (a key is at least {MIN_KEY_CHARS} printable "
                         "ASCII characters)")
    folder = os.path.join(base, "keys")
    os.makedirs(folder, mode=0o700, exist_ok=True)
    os.chmod(folder, 0o700)  # makedirs leaves an existing directory as it was
    files = {KEY_NAME: key + "\n"}
    for name in sorted(os.listdir(folder)):  # those a release made before reads, under their own names
        if name.endswith(ENV_SUFFIX) and not name.startswith(".") and os.path.isfile(os.path.join(folder, name)):
            files[name] = "".join(f"{n}={key}\n" for n in _names_in(os.path.join(folder, name)))
    for n in env_names:
        files[n + ENV_SUFFIX] = f"{n}={key}\n"
    placed = []
    for name, text in files.items():
        _write_private(os.path.join(folder, name), text)
        placed.append(os.path.join(folder, name))
    return {"placed": placed}
