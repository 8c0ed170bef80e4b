"""What runs on a board is edgekit's agent (edgekit/agent/, a real, linted, Python 3.8 package) or the probe
(edgekit/data/board/probe.sh, shellcheck-clean): not a program kept in a Python string and handed to
``sh -c`` / ``python3 -c``.

The test reads edgekit's own source: every argv with a shell's or a Python's ``-c`` outside the agent is found,
and every module-level string named like a board program (``*_PY``, ``*_SH``…). The few that run on the
workstation itself are listed (HERE); any other fails."""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
from pathlib import Path

from edgekit.resources import data_path

EDGEKIT = Path(__file__).resolve().parents[1] / "edgekit"
INTERPRETERS = {"sh", "bash", "/bin/sh", "python3", "python"}
PROGRAM_NAME = re.compile(r"^_?[A-Z_]*(_PY|_SH|_RO)$|^_(START|WAIT|STOP|STATE)$")

# `-c` programs that run on this machine, not on a board.
HERE = {
    "convert/litert.py": 2,  # the LiteRT venv's imports, checked on the workstation
    "sim/faults.py": 1,  # the simulated board's fault injector, on the workstation
    "sim/netns.py": 1,  # the network namespace's forwarding switch, as root on the workstation
}
def _is_interpreter(node: ast.expr) -> bool:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value in INTERPRETERS
    if isinstance(node, ast.BoolOp):  # `python or litert_python()`
        return any(_is_interpreter(v) for v in node.values)
    if isinstance(node, ast.Call):
        return _is_interpreter(node.func)
    name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""
    return "python" in name.lower() or name == "executable"  # sys.executable


def _dash_c_argvs(tree: ast.AST) -> int:
    """Sequences (list and tuple literals, a call's arguments) with a ``-c`` after a shell or a Python."""
    found = 0
    for node in ast.walk(tree):
        elts = node.elts if isinstance(node, (ast.List, ast.Tuple)) else node.args if isinstance(node, ast.Call) \
            else []
        for i, elt in enumerate(elts):
            if isinstance(elt, ast.Constant) and elt.value == "-c" and any(map(_is_interpreter, elts[:i])):
                found += 1
    return found


def _named_programs(tree: ast.Module, source: str) -> dict[str, int]:
    """Module-level board-program strings: name → lines."""
    out = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
            if PROGRAM_NAME.match(name):
                out[name] = (ast.get_source_segment(source, node.value) or "").count("\n") + 1
    return out


def scan() -> tuple[dict[str, tuple[int, int]], int]:
    """file → (`-c` argvs, named program strings) for every file that has any; and the lines those strings hold."""
    found: dict[str, tuple[int, int]] = {}
    lines = 0
    for path in sorted(EDGEKIT.rglob("*.py")):
        rel = path.relative_to(EDGEKIT).as_posix()
        if rel.startswith("agent/"):
            continue  # the agent runs on the board itself
        source = path.read_text(encoding="utf-8")
        tree = ast.parse(source)
        argvs, named = _dash_c_argvs(tree), _named_programs(tree, source)
        if argvs or named:
            found[rel] = (argvs, len(named))
            lines += sum(named.values())
    return found, lines


def test_no_board_program_is_kept_in_a_string() -> None:
    found, lines = scan()
    board = {k: v for k, v in found.items() if k not in HERE}
    assert {k: v[0] for k, v in found.items() if k in HERE} == HERE
    assert not board, f"board-side programs in strings: {board}; make them agent verbs (edgekit/agent/)"
    assert lines == 0


def test_the_store_transfer_and_guard_paths_hold_no_board_program() -> None:
    # What #49 moved first: the push (deploy and fleet), the store, the releases and the channel-bound guards are
    # agent verbs.
    found, _ = scan()
    for rel in ("remote/transfer.py", "remote/sshstream.py", "remote/probe.py", "fleet/plan.py", "remote/lock.py",
                "bench/power_modes.py", "remote/channel_guard.py", "remote/releases.py",
                "data/ansible/plugins/action/edgekit_blobs.py"):
        assert rel not in found, rel
    assert not (EDGEKIT / "remote" / "boardscripts.py").exists()


def test_the_probe_is_a_posix_sh_file_shellcheck_accepts() -> None:
    probe = data_path("board", "probe.sh")
    shellcheck = shutil.which("shellcheck") or str(Path(sys.executable).with_name("shellcheck"))
    res = subprocess.run([shellcheck, "--shell=sh", "--severity=style", str(probe)], capture_output=True,
                         text=True, check=False)
    assert res.returncode == 0, res.stdout[-3000:]
