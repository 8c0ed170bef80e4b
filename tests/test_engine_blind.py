"""Nothing outside the engines branches on an engine's name: deploy, bench, tune, fleet, report, plots and
sim ask the engine's class. A comparison with a built-in engine's name anywhere else fails."""

from __future__ import annotations

import ast
from pathlib import Path

from edgekit.config.engine_table import ENGINE_CLASSES

PACKAGE = Path(__file__).resolve().parents[1] / "edgekit"
# Where engine names belong: the engines themselves, the table, and LiteRT-LM's board-side front (which is
# that engine's server, run by the board's own LiteRT-LM Python).
OWNERS = ("engines/", "config/engine_table.py", "agent/litert_server.py")
NAMES = set(ENGINE_CLASSES)


def _names_compared(tree: ast.AST) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            for side in (node.left, *node.comparators):
                consts = side.elts if isinstance(side, (ast.Tuple, ast.List, ast.Set)) else [side]
                found += [(node.lineno, c.value) for c in consts
                          if isinstance(c, ast.Constant) and c.value in NAMES]
        elif isinstance(node, ast.Dict):  # a table keyed by engine name is a branch written as data
            found += [(node.lineno, k.value) for k in node.keys if isinstance(k, ast.Constant) and k.value in NAMES]
        elif isinstance(node, ast.match_case) and isinstance(node.pattern, ast.MatchValue):
            v = node.pattern.value
            if isinstance(v, ast.Constant) and v.value in NAMES:
                found.append((node.pattern.lineno, v.value))
    return found


def test_no_module_outside_the_engines_branches_on_an_engine_name() -> None:
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel.startswith(OWNERS):
            continue
        offenders += [f"edgekit/{rel}:{line}: {name!r}" for line, name in _names_compared(ast.parse(path.read_text()))]
    assert not offenders, "ask the engine's class (edgekit.engines.get_engine) instead:\n" + "\n".join(offenders)


def test_the_guard_sees_a_branch_on_a_name() -> None:
    # The control: each shape of branch the guard exists to catch is caught.
    code = ('if rel.engine == "vllm": pass\n'
            'x = engine in ("litert-lm", "other")\n'
            'colors = {"llama.cpp": "#1f77b4"}\n'
            'match e:\n    case "vllm": pass\n')
    assert [name for _, name in _names_compared(ast.parse(code))] == ["vllm", "litert-lm", "llama.cpp", "vllm"]
