"""The layers of pyproject.toml's [tool.importlinter] hold: nothing imports upward, and the board-side
agent imports nothing else of edgekit. A control proves the check can fail: the same contracts on a copy of
the package with one upward import added are broken, and lint-imports names that import."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _lint(root: Path) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).with_name("lint-imports")
    if not exe.is_file():
        # CI's environment is .ci/install's, which installs it: there a missing linter is a broken install.
        assert not os.environ.get("CI"), f"{exe} is missing: .ci/install installs the test extra"
        pytest.skip("import-linter is not installed (pip install import-linter; .ci/install does it)")
    env = dict(os.environ, PYTHONPATH=str(root))
    return subprocess.run([str(exe), str(root / "pyproject.toml"), "--no-cache"], cwd=root,
                          capture_output=True, text=True, timeout=300, check=False, env=env)


def test_no_module_imports_upward() -> None:
    res = _lint(REPO)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
    assert "Contracts: 2 kept, 0 broken." in res.stdout


def test_an_upward_import_breaks_the_contract(tmp_path: Path) -> None:
    shutil.copytree(REPO / "edgekit", tmp_path / "edgekit", ignore=shutil.ignore_patterns("__pycache__", "data"))
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    release = tmp_path / "edgekit" / "release" / "plan.py"
    upward = "\n\ndef _upward() -> None:\n    from edgekit.deploy import pipeline  # noqa: F401\n"
    release.write_text(release.read_text() + upward)
    res = _lint(tmp_path)
    assert res.returncode != 0
    assert "edgekit.release is not allowed to import edgekit.deploy" in res.stdout
    assert "edgekit.release.plan -> edgekit.deploy.pipeline" in res.stdout
