"""A board's API key on the board: ``<base>/keys/api.key`` (the key, for llama-server's --api-key-file, the
LiteRT-LM front and edgekit's checks) and ``<base>/keys/api.env`` (``VLLM_API_KEY=…``, vLLM's unit reads it as
an EnvironmentFile), each 0600 in a 0700 directory owned by the SSH user.

Releases name these paths, never the key, so a new key needs no new release: it is written beside the old one
and renamed over it, and the server reads it when it (re)starts. The bytes go through SFTP (or a local write),
never through a command line.
"""

from __future__ import annotations

import os

from edgekit.agent.keyfile import MIN_KEY_CHARS, key_problem
from edgekit.errors import EdgekitError
from edgekit.remote.runner import LocalRunner, SshRunner

KEY_NAME, ENV_NAME = "api.key", "api.env"


def keys_dir(base: str) -> str:
    return f"{base}/keys"


def key_file(base: str) -> str:
    return f"{keys_dir(base)}/{KEY_NAME}"


def env_file(base: str) -> str:
    return f"{keys_dir(base)}/{ENV_NAME}"


def _write_private(runner: SshRunner | LocalRunner, path: str, text: str) -> None:
    """``text`` into ``path`` (created 0600; its directory is 0700 already, so nobody else reads it meanwhile)."""
    if isinstance(runner, LocalRunner):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        return
    with runner.sftp().open(path, "w") as fh:  # the connection's one SFTP session: not closed here
        fh.chmod(0o600)
        fh.write(text.encode())


def place(runner: SshRunner | LocalRunner, base: str, key: str) -> None:
    """The key (and vLLM's environment file of it) on the board, each replaced with one rename; refused (before
    anything is written) when it is no key the board's servers would start with (edgekit.agent.keyfile)."""
    problem = key_problem(key)
    if problem is not None:
        raise EdgekitError(f"Refusing to place this API key on the board: the key {problem} "
                           f"(a key is at least {MIN_KEY_CHARS} printable ASCII characters).")
    folder = keys_dir(base)
    runner.run(["mkdir", "-p", "-m", "0700", folder], timeout=30)
    runner.run(["chmod", "0700", folder], timeout=30)  # mkdir -m leaves an existing directory as it was
    for name, text in ((KEY_NAME, f"{key}\n"), (ENV_NAME, f"VLLM_API_KEY={key}\n")):
        tmp = f"{folder}/.{name}.new"
        _write_private(runner, tmp, text)
        runner.run(["mv", "-f", tmp, f"{folder}/{name}"], timeout=30)


def placed(runner: SshRunner | LocalRunner, base: str) -> bool:
    """Whether the board holds a key file (an earlier deploy or rotation put it there)."""
    return runner.run(["test", "-s", key_file(base)], check=False, timeout=30).ok
