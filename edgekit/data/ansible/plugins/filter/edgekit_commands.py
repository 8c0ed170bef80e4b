"""Filters `edgekit_rollout_cmd`, `edgekit_board_cmd`: edgekit's board commands; `edgekit_state_args`: the
arguments of the agent's `state` (for the action `edgekit_agent`);
`edgekit_outcome`: what the board's activation program printed (edgekit.fleet.commands.activation).

The commands are edgekit's own Python (edgekit.fleet.commands), the one source for the rollout,
rollback and status plays; Ansible runs from edgekit's environment, so it imports it from there.

    {{ edgekit_plan | edgekit_rollout_cmd(edgekit_fleet, 'activate') }}
    {{ state | edgekit_board_cmd(edgekit_fleet, 'rollback', release, manifest) }}
    {{ edgekit_fleet | edgekit_state_args(base, release, unit) }}
    {{ out.stdout | edgekit_outcome }}
"""

from __future__ import annotations

from typing import Any

from edgekit.fleet import commands

DOCUMENTATION = """
    name: edgekit_rollout_cmd
    short_description: edgekit's board commands (edgekit.fleet.commands)
    description: A board command line, quoted, from the rollout's plan or the board's release state.
"""


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"edgekit_rollout_cmd": commands.rollout, "edgekit_board_cmd": commands.on_board,
                "edgekit_state_args": commands.state_args, "edgekit_outcome": commands.activation}
