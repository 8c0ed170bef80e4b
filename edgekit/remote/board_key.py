"""A board's API key on the board: ``<base>/keys/api.key`` (the key, for a server that takes a key file, such as
llama-server's --api-key-file, and for edgekit's checks) and, for an engine whose server reads its key from an
environment variable (``EngineBase.key_env``), ``<base>/keys/<NAME>.env`` (``NAME=…``, its unit's environment
file), each 0600 in a 0700 directory owned by the SSH user.

Releases name these paths, never the key, so a new key needs no new release: the agent's `key-place` writes it
beside the old one and renames it over it, and the server reads it when it (re)starts. The key reaches the agent on
its stdin, never on a command line.
"""

from __future__ import annotations

from collections.abc import Sequence

from edgekit.agent.key_place import ENV_SUFFIX, KEY_NAME
from edgekit.agent.keyfile import MIN_KEY_CHARS, key_problem
from edgekit.errors import EdgekitError
from edgekit.remote import agent_call
from edgekit.remote.runner import LocalRunner, SshRunner


def keys_dir(base: str) -> str:
    return f"{base}/keys"


def key_file(base: str) -> str:
    return f"{keys_dir(base)}/{KEY_NAME}"


def env_file(base: str, name: str) -> str:
    """The environment file that gives a server the key as ``name``."""
    return f"{keys_dir(base)}/{name}{ENV_SUFFIX}"


def place(runner: SshRunner | LocalRunner, base: str, key: str, env_names: Sequence[str] = ()) -> None:
    """The key on the board (and an environment file of it for each of ``env_names``; those already there are
    rewritten too), each replaced with one rename; refused (before anything is written) when it is no key the
    board's servers would start with (edgekit.agent.keyfile): here, so the key never leaves this machine, and by
    the agent again."""
    problem = key_problem(key)
    if problem is not None:
        raise EdgekitError(f"Refusing to place this API key on the board: the key {problem} "
                           f"(a key is at least {MIN_KEY_CHARS} printable ASCII characters).")
    env = [a for n in env_names for a in ("--env", n)]
    agent_call.call(runner, base, "key-place", base, *env, stdin=f"{key}\n".encode(), timeout=30,
                    doing="Placing the API key")


def placed(runner: SshRunner | LocalRunner, base: str) -> bool:
    """Whether the board holds a key file (an earlier deploy or rotation put it there)."""
    return runner.run(["test", "-s", key_file(base)], check=False, timeout=30).ok
