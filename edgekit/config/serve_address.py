"""Where a board's server may listen: its own loopback, unless a key guards it.

edgekit itself never needs the port open to the network (health, bench and tune reach the server through
the SSH connection), and the robot's own software runs on the board, so the default is 127.0.0.1. An
address other machines can reach would hand them completions, other users' prompts (llama-server's
/slots) and the board's compute, with no credential: such a recipe is refused before anything is sent.
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
    """The one sentence for a recipe that asks for a network address (keys are not supported yet)."""
    return (f"{host} would serve the model to every machine that reaches the board, with no key; edgekit serves "
            f"on the board's loopback ({LOOPBACK_HOST}: the board's own software reaches it, and a workstation "
            f"through SSH, e.g. ssh -L 8080:{LOOPBACK_HOST}:8080 <board>), and serving to a network with a key "
            "(runtime.auth: key) is not in this edgekit yet")
