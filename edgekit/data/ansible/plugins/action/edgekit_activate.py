"""Action `edgekit_activate`: edgekit's activation of the planned release on one board, one round trip.

The command is edgekit's own (edgekit.fleet.commands.Board.activate, from the board's plan and the state
edgekit read): a board that serves the release is checked first and left alone when healthy; otherwise
a candidate beside the serving release (strategy "candidate"), the service's restart and check, then
`current` and `serving`, the health record and the prune. What it printed is read here
(commands.activation), so the task needs no conditionals: Ansible 2.19 compiles each one anew in every
worker. In check mode only a board that serves the release is checked, and nothing starts.

Options:
  plan:   the board's plan (edgekit.fleet.plan.BoardPlan.to_vars, with its state)
  fleet:  edgekit_fleet (agent, units, health settings)

Returns rc, stdout, stderr and `outcome` (each step's Health, the steps that started a unit — `begun`,
`ok`, and `log`: whose log tells why not); changed when a unit was started; failed when the command
failed or the step that decides was not healthy.
"""

from __future__ import annotations

from typing import Any

from ansible.plugins.action import ActionBase
from edgekit.fleet import commands


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _supports_check_mode = True
    _requires_connection = True

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result = super().run(tmp, task_vars)
        plan, fleet = self._task.args.get("plan") or {}, self._task.args.get("fleet") or {}
        check = bool(self._task.check_mode)
        if check and not plan["state"]["serves"]:
            return {**result, "skipped": True, "changed": False,
                    "skip_reason": "check mode: the board does not serve the planned release yet"}
        # executable=False, as the raw action: the command runs as given, not wrapped in another shell.
        res = self._low_level_execute_command(commands.rollout(plan, fleet, "check" if check else "activate"),
                                              sudoable=False, executable=False)
        outcome = (commands.checked if check else commands.activation)(res.get("stdout") or "")
        result.update(rc=res.get("rc"), stdout=res.get("stdout") or "", stderr=res.get("stderr") or "",
                      outcome=outcome, changed=bool(outcome["begun"]))
        if res.get("rc") != 0 or not (check or outcome["ok"]):
            result["failed"] = True
            result["msg"] = "the activation failed" if res.get("rc") == 0 else f"the activation exited {res.get('rc')}"
        return result
