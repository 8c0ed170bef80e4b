"""The agent runs on JetPack 5's Python 3.8: its files must parse as 3.8 and use only the standard
library; and where a real 3.8 interpreter is at hand, the agent runs under it."""

from __future__ import annotations

import ast
import glob
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_agent_support import AGENT_DIR, ina3221, run_agent, set_ina3221

AGENT_FILES = sorted(AGENT_DIR.glob("*.py"))
# jtop: imported only when the board has jetson-stats; litert_lm: only by litert_server.py, which the
# board's LiteRT-LM Python runs for `bench --backend litert-lm` (never the agent's python3).
ALLOWED_THIRD_PARTY = {"jtop", "litert_lm"}


def test_agent_files_parse_as_python_3_8() -> None:
    assert len(AGENT_FILES) >= 8
    for path in AGENT_FILES:
        ast.parse(path.read_text(), filename=str(path), feature_version=(3, 8))


def test_agent_imports_only_the_standard_library() -> None:
    # ... and its own modules: the root helper, installed alone, imports unitspec from beside itself.
    stdlib = set(sys.stdlib_module_names) | {p.stem for p in AGENT_FILES}
    for path in AGENT_FILES:
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                assert top in stdlib or top in ALLOWED_THIRD_PARTY or top == "__future__", f"{path.name}: {name}"


def test_every_agent_module_has_postponed_annotations() -> None:
    # `list[int]` / `X | None` in annotations are fine on 3.8 only when they're never evaluated.
    for path in AGENT_FILES:
        if path.name in ("__init__.py", "__main__.py"):
            continue
        assert "from __future__ import annotations" in path.read_text(), path.name


def _python38() -> str | None:
    """A working python3.8, if this machine has one (pyenv installs count)."""
    candidates = [os.environ.get("EDGEKIT_PYTHON38", ""), "python3.8",
                  *sorted(glob.glob(os.path.join(os.path.expanduser(os.environ.get("PYENV_ROOT", "~/.pyenv")),
                                                 "versions", "3.8*", "bin", "python3.8"))),
                  "/usr/bin/python3.8"]
    for exe in filter(None, candidates):
        try:
            res = subprocess.run([exe, "-c", "import sys; print(sys.version_info[:2])"], capture_output=True,
                                 text=True, timeout=30, check=False)
        except (OSError, subprocess.SubprocessError):
            continue
        if res.returncode == 0 and res.stdout.strip() == "(3, 8)":
            return exe
    return None


def test_agent_runs_under_python_3_8(tmp_path: Path) -> None:
    py38 = _python38()
    if py38 is None:
        pytest.skip("no Python 3.8 interpreter here (set EDGEKIT_PYTHON38 to one); the 3.8 parse test still ran")
    root = tmp_path / "root"
    files = ina3221(root, "1-0040", ["VDD_IN", "VDD_CPU_GPU_CV", "VDD_SOC"])
    set_ina3221(files["VDD_IN"], 6.0)
    out = tmp_path / "s.jsonl"
    res = run_agent(["sample", "--out", str(out), "--hz", "20", "--duration", "0.6"], root, python=py38)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["total_rail"] == "VDD_IN"
    for args in (["energy", str(out)], ["snapshot"], ["idle", "--seconds", "0.3"], ["clock"],
                 ["wait-cool", "--below", "99", "--timeout", "1"]):
        res = run_agent(args, root, python=py38)
        assert res.returncode == 0, (args, res.stderr)
        json.loads(res.stdout)
    # python3 -m agent from the release directory works too (the other documented way to run it).
    release = tmp_path / "release"
    (release / "agent").mkdir(parents=True)
    for path in AGENT_FILES:
        (release / "agent" / path.name).write_text(path.read_text())
    env = {**os.environ, "EDGEKIT_BOARD_ROOT": str(root)}
    res = subprocess.run([py38, "-m", "agent", "clock"], cwd=release, env=env, capture_output=True, text=True,
                         timeout=60, check=False)
    assert res.returncode == 0, res.stderr
    assert set(json.loads(res.stdout)) == {"monotonic", "wall"}


def test_the_agent_zipapp_s_verbs_run_under_python_3_8(tmp_path: Path, agent_pyz: Path) -> None:
    py38 = _python38()
    if py38 is None:
        pytest.skip("no Python 3.8 interpreter here (set EDGEKIT_PYTHON38 to one); the 3.8 parse test still ran")
    base, data = tmp_path / "base", b"a blob"
    sha = hashlib.sha256(data).hexdigest()

    def verb(*args: str, stdin: bytes = b"") -> dict:
        res = subprocess.run([py38, str(agent_pyz), *args], input=stdin, capture_output=True, timeout=60, check=False)
        assert res.returncode == 0, (args, res.stderr.decode()[-2000:])
        return json.loads(res.stdout.decode().strip().splitlines()[-1])

    assert verb("inventory", "--create", str(base / "store"), sha)["have"] == {}
    assert verb("receive", str(base / "store"), sha, str(len(data)), "0", stdin=data)["result"] == "ok"
    assert verb("check", str(base / "store"), sha)["bad"] == []
    assert verb("release-create", str(base), "r1", "models/x", sha)["created"]
    assert verb("release-switch", "--serving", str(base), "r1")["current"] == "r1"
    assert verb("release-list", str(base))["releases"] == ["r1"]
    assert verb("guard", "--lock", str(base / ".deploy.lock"))["undone"] == []  # armed, then the channel closed
    assert verb("state", str(base), "--release", "r1")["has_release"]
    assert verb("verify-store", str(base))["checked"] == 1
    assert verb("key-place", str(base), stdin=b"k" * 43)["placed"]
    assert verb("python-has", "--dist", "no-such-dist", "--module", "json")["modules"] == {"json": None}
    assert verb("site-hold", str(base / "store"), str(base / "hold"), sha)["held"] == 1
    job = str(base / "job")
    assert verb("job-start", job, "true")["pid"] > 0
    for _ in range(100):
        done = verb("job-wait", job, "10")
        if done["state"] != "running":
            break
    assert done["state"] == "done" and done["rc"] == 0 and len(done["window"]) == 2
