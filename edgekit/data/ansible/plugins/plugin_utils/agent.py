"""What edgekit's actions share: edgekit's agent on the board (a zipapp named by its hash under `<base>/agent/`,
put there first when the board lacks it) and one of its verbs run, its one JSON answer read.

Commands run as given (``executable=False``, as the raw action: not wrapped in another `/bin/sh -c '… && sleep 0'`,
two more processes on the board per command); every argument is quoted.
"""

from __future__ import annotations

import json
import shlex
from typing import Any

from ansible.errors import AnsibleError
from ansible.plugins.action import ActionBase


class AgentAction(ActionBase):
    TRANSFERS_FILES = False  # the agent writes on the board itself: no remote tmp dir
    _requires_connection = True

    def _run(self, argv: list[str], data: bytes | None = None) -> dict[str, Any]:
        return self._low_level_execute_command(shlex.join(argv), sudoable=False, in_data=data, executable=False)

    def _agent(self, base: str, agent: dict[str, Any]) -> list[str]:
        """``python3 <base>/agent/<zipapp>``: put there first when the board lacks it (a temporary name, renamed).
        ``base`` may start with ``~`` (a board file's default): expanded on the board."""
        if base.startswith("~"):
            base = self._remote_expand_user(base, sudoable=False)
        where = f"{base.rstrip('/')}/{agent['dir']}"
        path = f"{where}/{agent['name']}"
        if self._run(["test", "-f", path]).get("rc") != 0:
            made = self._run(["mkdir", "-p", "--", where])
            if made.get("rc") != 0:
                raise AnsibleError(f"Cannot make {where} on the board: {self._why(made)}")
            tmp = f"{path}.ansible.tmp"
            self._connection.put_file(agent["src"], tmp)
            moved = self._run(["mv", "-f", "--", tmp, path])
            if moved.get("rc") != 0:
                raise AnsibleError(f"Cannot place edgekit's agent at {path}: {self._why(moved)}")
        return [str(agent.get("python") or "python3"), path]

    @staticmethod
    def _answer(res: dict[str, Any]) -> dict[str, Any] | None:
        """The verb's JSON object (its last line of output), or None when it printed none."""
        lines = (res.get("stdout") or "").strip().splitlines()
        try:
            got = json.loads(lines[-1]) if lines else None
        except ValueError:
            return None
        return got if isinstance(got, dict) else None

    @staticmethod
    def _why(res: dict[str, Any]) -> str:
        """The last line the board's command wrote to stderr (the agent's one sentence), or its exit status."""
        if res.get("rc") == 127:
            return "the board has no python3, which edgekit's agent needs (Python ≥ 3.8: JetPack 5 or later)"
        lines = (res.get("stderr") or "").strip().splitlines()
        return lines[-1].removeprefix("error: ").rstrip(".") if lines else f"exit {res.get('rc')}"
