"""Where a board's server may listen: its own loopback, unless a key guards it.

edgekit itself never needs the port open to the network (health, bench and tune reach the server through
the SSH connection), and the robot's own software runs on the board, so the default is 127.0.0.1. An
address other machines can reach would hand them completions, other users' prompts (llama-server's
/slots) and the board's compute, with no credential: such a recipe is refused before anything is sent,
unless it asks for a key (``runtime.auth: key``, edgekit.config.api_keys).
"""

from __future__ import annotations

import ipaddress

LOOPBACK_HOST = "127.0.0.1"


def is_loopback(host: str) -> bool:
    """True for an address only the board itself reaches (127.0.0.0/8, ::1, localhost)."""
    if host.lower() in ("localhost", "localhost.localdomain"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a name or an interface address: reachable from elsewhere, as far as edgekit can tell


def network_bind_refusal(host: str) -> str:
    """The one sentence for a recipe that asks for a network address without a key."""
    return (f"{host} would serve the model to every machine that reaches the board, with no key: add "
            f"runtime.auth: key (edgekit makes the board a key and every client must send it), or serve on the "
            f"board's loopback ({LOOPBACK_HOST}: the board's own software reaches it, and a workstation through "
            f"SSH, e.g. ssh -L 8080:{LOOPBACK_HOST}:8080 <board>)")
