"""An Ansible inventory rendered from the board file, so edgekit and Ansible agree on every board.

Each board becomes a host with its address, port, user and key, edgekit's profile and base
directory, and SSH options that trust only edgekit's pinned host keys (its known_hosts, strict
checking, no global known_hosts). Board-file groups become inventory groups; every board is also
in `profile_<profile>` (dashes as underscores).
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable
from typing import Any

import yaml

from edgekit.config.boardfile import Board, BoardFile
from edgekit.config.profiles import get_profile
from edgekit.errors import EdgekitError
from edgekit.remote.connection import openssh_options


def ssh_common_args(board: Board) -> str:
    """The strict host-key options edgekit's own SSH connections apply (RejectPolicy, its known_hosts)."""
    return shlex.join(openssh_options(board))


def host_vars(name: str, board: Board) -> dict[str, Any]:
    if board.local:
        hv: dict[str, Any] = {"ansible_connection": "local"}
    else:
        hv = {"ansible_host": board.host, "ansible_port": board.port, "ansible_user": board.user}
        if board.key:
            hv["ansible_ssh_private_key_file"] = str(board.key_path())
        hv["ansible_ssh_common_args"] = ssh_common_args(board)
    hv.update({"edgekit_board": name, "edgekit_profile": get_profile(board.profile).name, "edgekit_base": board.base})
    if board.service_port is not None:
        hv["edgekit_service_port"] = board.service_port
    return hv


def profile_group(profile: str) -> str:
    """`profile_<canonical profile>`: aliases (orin, thor) resolved, '-' and '.' as '_'."""
    return "profile_" + get_profile(profile).name.replace("-", "_").replace(".", "_")


def select(data: BoardFile, group: str | None = None, names: Iterable[str] | None = None) -> list[str]:
    """Board names of ``group`` (a board-file group or one board), or of ``names``, or all; board-file order."""
    if names is not None:
        wanted = list(names)
    elif group is None:
        wanted = list(data.boards)
    elif group in data.groups:
        wanted = data.groups[group]
    elif group in data.boards:
        wanted = [group]
    else:
        known = ", ".join(sorted(data.groups)) or "none"
        raise EdgekitError(f"{group!r} is neither a group nor a board in the board file (groups: {known}).")
    missing = [n for n in wanted if n not in data.boards]
    if missing:
        raise EdgekitError(f"No board named {missing[0]!r} in the board file.")
    order = {n: i for i, n in enumerate(data.boards)}
    return sorted(dict.fromkeys(wanted), key=order.__getitem__)


def render(data: BoardFile, names: Iterable[str] | None = None) -> dict[str, Any]:
    """The inventory as a dict (YAML inventory layout) for ``names`` (default: every board)."""
    chosen = select(data, names=names) if names is not None else list(data.boards)
    hosts = {n: host_vars(n, data.boards[n]) for n in chosen}
    children: dict[str, Any] = {}
    for group, members in data.groups.items():
        inside = [m for m in members if m in hosts]
        if inside:
            children[group] = {"hosts": {m: None for m in inside}}
    for n in chosen:
        pg = profile_group(data.boards[n].profile)
        if pg not in data.groups:
            children.setdefault(pg, {"hosts": {}})["hosts"][n] = None
    root: dict[str, Any] = {"hosts": hosts}
    if children:
        root["children"] = children
    return {"all": root}


def to_yaml(inventory: dict[str, Any]) -> str:
    header = "# Ansible inventory rendered by `edgekit fleet inventory` from edgekit's board file.\n"
    return header + yaml.safe_dump(inventory, sort_keys=False, default_flow_style=False)
