"""How edgekit runs a command as root on a board: one prefix per board, and the unit file verbs.

The prefix comes from the probe (``BoardFacts.sudo_prefix``): ``[]`` for a root login; ``[sudo, -n, HELPER]``
where `edgekit board setup --apply` installed the helper (agent/privileged.py, root-owned) and the login user may
run it; else ``[sudo, -n]`` (full passwordless sudo). systemctl, nvpmodel and jetson_clocks are written the same
way for all three (the helper takes them as verbs and checks them). Units are installed and removed by the agent's
`unit-install` and `unit-remove` verbs (agent/units.py): from a spec, through the helper where there is one.
"""

from __future__ import annotations

from collections.abc import Sequence

from edgekit.agent.privileged import CLOCKS_FILE, HELPER_PATH


def uses_helper(prefix: Sequence[str]) -> bool:
    return bool(prefix) and str(prefix[-1]).endswith(HELPER_PATH)


def clocks_file(prefix: Sequence[str], work: str) -> str:
    """Where jetson_clocks stores the clocks to put back: the helper allows one root-owned place only."""
    return CLOCKS_FILE if uses_helper(prefix) else f"{work}/clocks.conf"
