"""A board's API key on the board: ``<base>/keys/api.key`` (the key, for llama-server's --api-key-file, the
LiteRT-LM front and edgekit's checks) and ``<base>/keys/api.env`` (``VLLM_API_KEY=…``, vLLM's unit reads it as
an EnvironmentFile), each 0600 in a 0700 directory owned by the SSH user.

Releases name these paths, never the key, so a new key needs no new release: the agent's `key-place` writes it
beside the old one and renames it over it, and the server reads it when it (re)starts. The key reaches the agent on
its stdin, never on a command line.
"""

from __future__ import annotations

from edgekit.agent.key_place import ENV_NAME, KEY_NAME
from edgekit.agent.keyfile import MIN_KEY_CHARS, key_problem
from edgekit.errors import EdgekitError
from edgekit.remote import agent_call
from edgekit.remote.runner import LocalRunner, SshRunner


def keys_dir(base: str) -> str:
    return f"{base}/keys"


def key_file(base: str) -> str:
    return f"{keys_dir(base)}/{KEY_NAME}"


def env_file(base: str) -> str:
    return f"{keys_dir(base)}/{ENV_NAME}"


def place(runner: SshRunner | LocalRunner, base: str, key: str) -> None:
    """The key (and vLLM's environment file of it) on the board, each replaced with one rename; refused (before
    anything is written) when it is no key the board's servers would start with (edgekit.agent.keyfile): here, so
    the key never leaves this machine, and by the agent again."""
    problem = key_problem(key)
    if problem is not None:
        raise EdgekitError(f"Refusing to place this API key on the board: the key {problem} "
                           f"(a key is at least {MIN_KEY_CHARS} printable ASCII characters).")
    agent_call.call(runner, base, "key-place", base, stdin=f"{key}\n".encode(), timeout=30,
                    doing="Placing the API key")


def placed(runner: SshRunner | LocalRunner, base: str) -> bool:
    """Whether the board holds a key file (an earlier deploy or rotation put it there)."""
    return runner.run(["test", "-s", key_file(base)], check=False, timeout=30).ok
