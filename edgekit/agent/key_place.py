"""`key-place BASE`: a board's API key, read from stdin (never an argument: a command line is visible to every user
of the board), into ``BASE/keys/api.key`` (the key: llama-server's --api-key-file, the LiteRT-LM front, edgekit's
checks) and ``BASE/keys/api.env`` (``VLLM_API_KEY=…``: vLLM's unit reads it as an EnvironmentFile), each 0600 in a
0700 directory, each written beside the old one, fsynced and renamed over it: a server (re)started meanwhile reads
the old key or the new one, never a part. Refused, before anything is written, when it is no key the board's servers
would start with (keyfile.key_problem). Standard library only (Python 3.8).
"""

from __future__ import annotations

import os
from typing import Any

from .keyfile import MAX_KEY_BYTES, MIN_KEY_CHARS, key_problem

KEY_NAME, ENV_NAME = "api.key", "api.env"


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


def place(base: str, raw: bytes) -> dict[str, Any]:
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
    placed = []
    for name, text in ((KEY_NAME, key + "\n"), (ENV_NAME, f"VLLM_API_KEY={key}\n")):
        _write_private(os.path.join(folder, name), text)
        placed.append(os.path.join(folder, name))
    return {"placed": placed}
