"""One verb of edgekit's agent on a board: argv in, one JSON object out (or one sentence of why not).

The workstation side only builds the verb's arguments and reads its answer; what the verb does is the agent's
(edgekit/agent/cli.py lists them), the same for deploy, the fleet and the bench.
"""

from __future__ import annotations

import json
from typing import Any

from edgekit.errors import EdgekitError
from edgekit.remote import agent_ship
from edgekit.remote.runner import Result, Runner


def why(res: Result) -> str:
    """The last line the agent wrote to stderr (its one sentence), else its exit status."""
    if res.exit_code == 127:
        return "the board has no python3, which edgekit's agent needs (Python ≥ 3.8: JetPack 5 or later)"
    if "SyntaxError" in res.stderr:
        return "the board's python3 is older than 3.8, which edgekit's agent needs (JetPack 5 or later)"
    lines = [ln for ln in res.stderr.strip().splitlines() if ln.strip()]
    return (lines[-1].removeprefix("error: ").rstrip(".") if lines else f"exit {res.exit_code}")[:300]


def answer(res: Result) -> dict[str, Any] | None:
    """The verb's JSON object (its last line of output), or None when it printed none."""
    lines = res.stdout.strip().splitlines()
    try:
        got = json.loads(lines[-1]) if lines else None
    except ValueError:
        return None
    return got if isinstance(got, dict) else None


def run(runner: Runner, root: str, verb: str, *args: str, timeout: float | None = None,
        python: str = agent_ship.PYTHON, stdin: bytes | None = None) -> Result:
    """The verb run on the board (the agent sent first if this board lacks it); its result, whatever its exit.
    ``python``: the board's interpreter that runs it (another than python3 for a verb about that Python); ``stdin``:
    what the verb reads (a secret goes this way, never as an argument)."""
    path = agent_ship.ensure(runner, root)
    res = runner.run(agent_ship.argv(path, verb, *args, python=python), check=False, timeout=timeout, stdin=stdin)
    if res.exit_code == 2 and "can't open file" in res.stderr:  # pruned meanwhile (it goes with its releases)
        runner.agents.discard(path)
        path = agent_ship.ensure(runner, root)
        res = runner.run(agent_ship.argv(path, verb, *args, python=python), check=False, timeout=timeout,
                         stdin=stdin)
    return res


def call(runner: Runner, root: str, verb: str, *args: str, timeout: float | None = None,
         doing: str | None = None, python: str = agent_ship.PYTHON, stdin: bytes | None = None) -> dict[str, Any]:
    """The verb's answer; EdgekitError with the agent's sentence when it failed."""
    res = run(runner, root, verb, *args, timeout=timeout, python=python, stdin=stdin)
    got = answer(res)
    if not res.ok or got is None:
        raise EdgekitError(f"{doing or f'The agent verb {verb!r}'} on board {runner.name!r} failed: {why(res)}.")
    return got
