"""A server's API key file, checked before the server starts (``runtime.auth: key``).

An engine given an empty key file may serve every request without a key (the LiteRT-LM front did), and
one given a short key is as good as open; so the agent reads the file here and refuses what edgekit would
never have made. edgekit's keys are ``secrets.token_urlsafe(32)``: 43 characters of ``A-Za-z0-9_-``. A key is
at least ``MIN_KEY_CHARS`` printable ASCII characters, with no space, no control and no non-ASCII character
(it goes into an HTTP header and into vLLM's environment file). The workstation's edgekit.config.api_keys and
edgekit.remote.board_key apply the same rule (``key_problem``) before they keep or place a key.

Standard library only: the agent's python3 and the board's LiteRT-LM Python both import it.
"""

from __future__ import annotations

MIN_KEY_CHARS = 32
MAX_KEY_BYTES = 4096  # far more than a key: read no further (a key file that is a device or a log is no key)


class KeyFileError(Exception):
    """The key file cannot be read or holds no usable key; ``str()`` is one sentence."""


def key_problem(key: str) -> str | None:
    """What is wrong with ``key`` (stripped already), to follow "the key …", or None when it is a usable key."""
    if not key:
        return "is empty"
    if any(not "!" <= c <= "~" for c in key):
        return "holds a non-printable character (a key is printable ASCII, with no space)"
    if len(key) < MIN_KEY_CHARS:
        return f"is {len(key)} characters long, shorter than the {MIN_KEY_CHARS} a key needs"
    return None


def read_key(path: str) -> str:
    """The key in the file at ``path``, stripped of surrounding whitespace; KeyFileError when there is none."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read(MAX_KEY_BYTES + 1)
    except OSError as exc:
        raise KeyFileError(f"cannot read the API key file {path}: {exc.strerror or exc}.") from None
    if len(raw) > MAX_KEY_BYTES:
        raise KeyFileError(f"the API key file {path} is longer than {MAX_KEY_BYTES} bytes, so it holds no key.")
    key = raw.strip().decode("latin-1")  # one character per byte: any byte outside printable ASCII is refused
    problem = key_problem(key)
    if problem is not None:
        raise KeyFileError(f"the API key in {path} {problem}.")
    return key
