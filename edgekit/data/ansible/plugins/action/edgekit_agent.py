"""Action `edgekit_agent`: one verb of edgekit's agent on the board, its JSON answer returned.

The agent (a zipapp named by its hash under `<base>/agent/`) is put there first when the board lacks it, so a
play that runs before any push (`edgekit fleet status`, a fleet owner's own playbook) can count on it.

Options:
  fleet:  edgekit_fleet (its `agent`: name, src, dir, python)
  base:   the board's edgekit directory (edgekit_base; may start with ~)
  verb:   the agent's verb (edgekit/agent/cli.py lists them), e.g. `state`
  args:   its arguments (a list; each is quoted)
  changes: whether the verb changes the board (reported as changed); default false

Returns rc, stdout, stderr and `answer` (the verb's JSON object); fails with the agent's one sentence when the
verb failed or printed no answer. Runs in check mode too (the verbs a play runs there only read).
"""

from __future__ import annotations

from typing import Any

from ansible_collections.edgekit.fleet.plugins.plugin_utils.agent import AgentAction

ARGUMENT_SPEC = {
    "fleet": {"type": "dict", "required": True},
    "base": {"type": "str", "required": True},
    "verb": {"type": "str", "required": True},
    "args": {"type": "list", "elements": "str", "default": []},
    "changes": {"type": "bool", "default": False},
}


class ActionModule(AgentAction):
    _supports_check_mode = True

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result = super().run(tmp, task_vars)
        _, opts = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)
        agent = self._agent(opts["base"], opts["fleet"]["agent"])
        verb = opts["verb"]
        res = self._run([*agent, verb, *opts["args"]])
        answer = self._answer(res)
        result.update(rc=res.get("rc"), stdout=res.get("stdout", ""), stderr=res.get("stderr", ""), answer=answer,
                      changed=opts["changes"] and res.get("rc") == 0)
        if res.get("rc") != 0 or answer is None:
            result.update(failed=True, msg=f"edgekit's agent ({verb}) failed on the board: {self._why(res)}")
        return result
