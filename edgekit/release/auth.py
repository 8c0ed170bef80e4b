"""What a release that asks for an API key (``runtime.auth: key``) records: where the board keeps the key.

The paths go into release.json (and so into the release's id); the key does not, so rotating it needs no
new release (edgekit.remote.board_key writes it, edgekit.config.api_keys keeps the workstation's copy).
"""

from __future__ import annotations

from edgekit.remote import board_key


def auth_fields(auth: str, base: str, key_env: str | None = None) -> dict[str, str]:
    """release.json's ``api_key_file`` (and, for a server that reads its key from the variable ``key_env``,
    ``api_env_file``: its unit's environment file) for a server that asks for a key, else nothing."""
    if auth != "key":
        return {}
    env = {"api_env_file": board_key.env_file(base, key_env)} if key_env else {}
    return {"api_key_file": board_key.key_file(base), **env}
