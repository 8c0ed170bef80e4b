"""The product a user installs: a wheel of this repository, installed (not editable) into a fresh virtualenv
with a fresh HOME, run from an empty directory — recipes, the demo, a fleet rollout and `sim down` work there
as they do in a checkout, because everything the CLI uses ships in the package.

The llama.cpp build and converted models come from the shared content-addressed cache (EDGEKIT_CACHE):
the same bytes a first run would make, without a second 5-minute build. pip takes the dependencies from
its download cache (the registries' bytes), so the install is a real resolution of the wheel's metadata.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import time
import urllib.request
import zipfile
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from build_helpers import sdist_or_skip

from edgekit.paths import cache_dir

REPO = Path(__file__).resolve().parents[1]
SHIPPED = [  # what the CLI opens at run time, by path inside the wheel
    "edgekit/data/recipes/e2b-mtp.yaml", "edgekit/data/recipes/sim-gemma3-270m.yaml",
    "edgekit/data/ansible/ansible.cfg", "edgekit/data/ansible/playbooks/rollout.yml",
    "edgekit/data/ansible/roles/edgekit_release/tasks/main.yml",
    "edgekit/data/ansible/plugins/action/edgekit_blobs.py", "edgekit/data/ansible/plugins/callback/edgekit_report.py",
    "edgekit/data/ansible/plugins/filter/edgekit_commands.py", "edgekit/data/ansible/galaxy.yml",
    "edgekit/data/ci/nightly-bench.yml", "edgekit/data/ci/actionlint.yaml", "edgekit/data/results-schema.json",
    "edgekit/agent/cli.py", "edgekit/sim/bin/systemctl", "edgekit/build/__init__.py", "edgekit/release/manifest.py",
]


def _not_sources(folder: str, names: list[str]) -> set[str]:
    """What a copy of the checkout leaves out: caches everywhere, and the venv and build outputs at its root
    only (edgekit/build/ is a package)."""
    skip = {n for n in names if n in ("__pycache__", ".pytest_cache", ".ruff_cache") or n.endswith(".egg-info")}
    if Path(folder).resolve() == REPO:
        skip |= {n for n in names if n in (".venv", ".git", "build", "dist")}
    return skip


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    # Built from a copy: setuptools writes build/ and *.egg-info beside the sources, and a stale build/lib of
    # the checkout would go into the wheel.
    src = tmp_path_factory.mktemp("src") / "edgekit"
    shutil.copytree(REPO, src, ignore=_not_sources)
    res = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(src)],
                         capture_output=True, text=True, timeout=600, check=False)
    assert res.returncode == 0, res.stderr[-3000:]
    (whl,) = out.glob("edgekit_jetson-*.whl")
    return whl


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A fresh venv with the wheel and its [sim,fleet] extras, and the environment a new user has."""
    root = tmp_path_factory.mktemp("installed")
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    t = time.monotonic()
    res = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                          f"{wheel}[sim,fleet]"], capture_output=True, text=True, timeout=900, check=False)
    assert res.returncode == 0, res.stderr[-3000:]
    print(f"wheel {wheel.stat().st_size / 1e6:.2f} MB installed with [sim,fleet] in {time.monotonic() - t:.1f} s")
    (root / "home").mkdir()
    (root / "work").mkdir()  # an empty directory: no recipes/, no ansible/, no pyproject.toml
    env = {
        "HOME": str(root / "home"), "PATH": f"{venv / 'bin'}:/usr/local/bin:/usr/bin:/bin",
        "LANG": os.environ.get("LANG", "C.UTF-8"), "EDGEKIT_CACHE": str(cache_dir()),
        "EDGEKIT_SIM_DIR": str(root / "sim"), "EDGEKIT_LLAMA_SRC": str(sdist_or_skip()),
        "VENV": str(venv), "WORK": str(root / "work"),
    }
    try:
        yield env
    finally:
        run(env, "sim", "down", check=False)


def run(env: dict[str, str], *args: str, check: bool = True, timeout: float = 1200) -> subprocess.CompletedProcess:
    res = subprocess.run([str(Path(env["VENV"]) / "bin" / "edgekit"), *args], capture_output=True, text=True,
                         timeout=timeout, check=False, env=env, cwd=env["WORK"])
    if check:
        assert res.returncode == 0, (res.stderr + res.stdout)[-3000:]
        assert "Traceback" not in res.stderr
    return res


def test_the_wheel_ships_what_the_cli_uses(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    assert [p for p in SHIPPED if p not in names] == []
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]
    meta = next(n for n in names if n.endswith(".dist-info/METADATA"))
    text = zipfile.ZipFile(wheel).read(meta).decode()
    assert "Name: edgekit-jetson" in text and "Provides-Extra: fleet" in text


def test_installed_edgekit_runs_from_an_empty_directory(installed: dict[str, str]) -> None:
    env = installed
    site = run(env, "--version")
    assert "edgekit" in site.stdout
    # Nothing of the checkout is importable: the package comes from the venv's site-packages.
    where = subprocess.run([str(Path(env["VENV"]) / "bin" / "python"), "-c", "import edgekit; print(edgekit.__file__)"],
                           capture_output=True, text=True, env=env, cwd=env["WORK"], check=True)
    assert where.stdout.startswith(env["VENV"]) and str(REPO) not in where.stdout

    recipes = json.loads(run(env, "--json", "recipes", "list").stdout)
    by_name = {r["name"]: r for r in recipes}
    assert {"e2b-mtp", "e4b-mtp", "e2b", "sim-gemma3-270m"} <= set(by_name)
    assert by_name["e2b-mtp"]["origin"] == "builtin" and by_name["e2b-mtp"]["path"].startswith(env["VENV"])
    # A user recipe in the config dir shadows the built-in one, and says so.
    user = Path(env["HOME"]) / ".config" / "edgekit" / "recipes"
    user.mkdir(parents=True)
    (user / "e2b-mtp.yaml").write_text(Path(by_name["e2b-mtp"]["path"]).read_text())
    shadowed = {r["name"]: r for r in json.loads(run(env, "--json", "recipes", "list").stdout)}["e2b-mtp"]
    assert shadowed["origin"] == "user" and "shadows the built-in e2b-mtp" in shadowed["from"]
    (user / "e2b-mtp.yaml").unlink()
    assert run(env, "push", "--help").stdout.startswith("Usage: edgekit push")

    # The main job on a simulated board, ending with a completion.
    demo = json.loads(run(env, "--json", "demo").stdout)
    assert demo["deploy"]["health"]["ok"] and demo["deploy"]["health"]["text"].strip()
    # The request the demo tells the user to paste answers.
    argv = shlex.split(demo["try"])
    url, body = argv[argv.index("-s") + 1], argv[argv.index("-d") + 1].encode()
    req = urllib.request.Request(url, body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        assert json.loads(resp.read())["tokens_predicted"] > 0
    # So do the OpenAI client lines it prints, run as written (this venv has openai): text, not ChatML.
    said = subprocess.run([sys.executable, "-c", demo["python"]], capture_output=True, text=True, timeout=300)
    assert said.returncode == 0 and sum(c.isalpha() for c in said.stdout) >= 3, said.stdout + said.stderr[-2000:]
    assert "<|im_" not in said.stdout, said.stdout

    # A fleet rollout of a built-in recipe to two simulated boards, with the playbooks from the package.
    run(env, "sim", "up", "--boards", "2")
    fleet = json.loads(run(env, "--json", "fleet", "rollout", "--recipe", "sim-gemma3-270m", "--no-canary").stdout)
    assert sorted(fleet["succeeded"]) == ["sim-1", "sim-2"] and not fleet["failed"]
    assert all(row["health"]["ok"] for row in fleet["succeeded"].values())

    # sim down leaves nothing running.
    run(env, "sim", "down")
    assert _processes_under(env["EDGEKIT_SIM_DIR"]) == []


def _processes_under(path: str) -> list[int]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if any(path in part for part in proc.info["cmdline"] or ()):
                found.append(proc.pid)
        except psutil.Error:
            continue
    return found
