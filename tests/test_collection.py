"""The edgekit.fleet collection as a fleet owner uses it: built with ansible-galaxy, installed into a
collections path of their own, its role called from a playbook of their own against a simulated board."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import yaml
from build_helpers import sdist_or_skip
from cli_helpers import edgekit

from edgekit.resources import ansible_collection_dir

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
GALAXY, PLAYBOOK = BIN / "ansible-galaxy", BIN / "ansible-playbook"

pytestmark = pytest.mark.skipif(not PLAYBOOK.is_file(),
                                reason="ansible-core is not installed (pip install 'ansible-core==2.19.*')")

# The minimal user playbook of docs/fleet.md and the collection's README.md.
USER_PLAYBOOK = """\
- name: Status of my Jetson boards
  hosts: all
  gather_facts: false
  roles:
    - role: edgekit.fleet.edgekit_status
"""


def galaxy_meta() -> dict:
    return yaml.safe_load((ansible_collection_dir() / "galaxy.yml").read_text())


def test_collection_version_is_the_package_version() -> None:
    meta = galaxy_meta()
    # [project] version of pyproject.toml (no tomllib: Python 3.10 runs these tests too)
    project = re.search(r'^\[project\]$.*?^version = "([^"]+)"$', (REPO / "pyproject.toml").read_text(), re.M | re.S)
    assert project, "no [project] version in pyproject.toml"
    assert (meta["namespace"], meta["name"]) == ("edgekit", "fleet")
    assert meta["version"] == project.group(1)
    runtime = yaml.safe_load((ansible_collection_dir() / "meta" / "runtime.yml").read_text())
    assert runtime["requires_ansible"] == ">=2.19.0,<2.20.0"


def test_docs_show_the_playbook_the_test_runs() -> None:
    for doc in (REPO / "docs" / "fleet.md", ansible_collection_dir() / "README.md"):
        assert USER_PLAYBOOK in doc.read_text(), doc


def build(out: Path) -> Path:
    res = subprocess.run([str(GALAXY), "collection", "build", str(ansible_collection_dir()), "--output-path", str(out)],
                         capture_output=True, text=True, timeout=300, check=False, cwd=out)
    assert res.returncode == 0, res.stdout + res.stderr
    tarball = out / f"edgekit-fleet-{galaxy_meta()['version']}.tar.gz"
    assert tarball.is_file(), res.stdout
    return tarball


def test_built_collection_holds_the_content_and_no_workstation_files(tmp_path: Path) -> None:
    # A compiled plugin beside the sources, as a run leaves it: it must not ship.
    cache = ansible_collection_dir() / "plugins" / "filter" / "__pycache__"
    made = not cache.exists()
    cache.mkdir(exist_ok=True)
    stray = cache / "edgekit_test_stray.cpython-311.pyc"
    stray.write_bytes(b"")
    try:
        tarball = build(tmp_path)
    finally:
        stray.unlink()
        if made:
            shutil.rmtree(cache, ignore_errors=True)
    with tarfile.open(tarball) as tar:
        names = set(tar.getnames())
        manifest = json.loads(tar.extractfile("MANIFEST.json").read())  # type: ignore[union-attr]
    for must in ("README.md", "meta/runtime.yml", "playbooks/rollout.yml", "roles/edgekit_status/tasks/main.yml",
                 "roles/edgekit_status/defaults/main.yml", "plugins/filter/edgekit_commands.py",
                 "plugins/action/edgekit_blobs.py", "plugins/lookup/edgekit_fleet.py",
                 "plugins/callback/edgekit_report.py"):
        assert must in names, must
    unwanted = [n for n in names if n.endswith((".pyc", "ruff.toml", "ansible.cfg", ".ansible-lint"))
                or "__pycache__" in n or ".ruff_cache" in n or n.startswith(".ansible/")]
    assert not unwanted
    assert manifest["collection_info"]["version"] == galaxy_meta()["version"]


@pytest.fixture(scope="module")
def deployed(sim_session) -> tuple:
    """A fresh simulated board that `edgekit deploy` left serving a release, and that release's id."""
    (board,) = sim_session.boards(1, fresh=True)
    env = {**os.environ, **sim_session.env, "EDGEKIT_LLAMA_SRC": str(sdist_or_skip())}
    res = edgekit("--json", "deploy", "--board", board.name, "--recipe", "sim-tiny-mtp", env=env, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    return board, json.loads(res.stdout)["release"]


def test_user_playbook_runs_the_installed_collections_status_role_on_a_board(deployed, tmp_path: Path) -> None:
    board, release = deployed
    tarball = build(tmp_path)
    collections = tmp_path / "collections"
    res = subprocess.run([str(GALAXY), "collection", "install", str(tarball), "-p", str(collections)],
                         capture_output=True, text=True, timeout=300, check=False, cwd=tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    installed = collections / "ansible_collections" / "edgekit" / "fleet"
    assert (installed / "roles" / "edgekit_status" / "tasks" / "main.yml").is_file()
    assert not installed.is_symlink()

    # The fleet owner's own project: an inventory written by hand, the minimal playbook, no ansible.cfg.
    project = tmp_path / "project"
    project.mkdir()
    ssh_args = (f"-o UserKnownHostsFile={board.known_hosts} -o GlobalKnownHostsFile=/dev/null "
                "-o StrictHostKeyChecking=yes -o IdentitiesOnly=yes")
    inventory = {"jetsons": {"hosts": {"orin-lab": {
        "ansible_host": board.host, "ansible_port": board.port, "ansible_user": board.user,
        "ansible_ssh_private_key_file": str(board.key), "ansible_ssh_common_args": ssh_args,
        "edgekit_base": str(board.base)}}}}
    (project / "inventory.yml").write_text(yaml.safe_dump(inventory))
    (project / "status.yml").write_text(USER_PLAYBOOK + """\
  post_tasks:
    - name: Use what the role read
      ansible.builtin.debug:
        msg: "current={{ edgekit_status_state.current }}"
""")
    control = tmp_path / "cp"
    control.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    env.update({"ANSIBLE_COLLECTIONS_PATH": str(collections), "ANSIBLE_HOME": str(tmp_path / "ansible-home"),
                "ANSIBLE_SSH_CONTROL_PATH_DIR": str(control), "ANSIBLE_SHOW_CUSTOM_STATS": "true",
                "ANSIBLE_NOCOLOR": "1", "PATH": f"{BIN}:{env.get('PATH', '/usr/bin:/bin')}"})
    try:
        run = subprocess.run([str(PLAYBOOK), "-i", "inventory.yml", "status.yml"], capture_output=True, text=True,
                             timeout=300, check=False, cwd=project, env=env)
    finally:
        for sock in control.iterdir():  # the ControlPersist master Ansible's default ssh_args leave behind
            subprocess.run(["ssh", "-o", f"ControlPath={sock}", "-O", "exit", board.host], capture_output=True,
                           timeout=30, check=False)
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-4000:]
    assert re.search(r"orin-lab\s*:\s*ok=\d+\s+changed=0\s+unreachable=0\s+failed=0", out), out[-3000:]
    assert f"current={release}" in out
    stats = out[out.index("CUSTOM STATS"):]
    row = json.loads(stats[stats.index("{"):stats.rindex("}") + 1])["edgekit"]
    assert row["current"] == row["serving"] == release
    assert row["service_active"] is True and row["recipe"] == "sim-tiny-mtp"
    assert row["health"]["ok"] is True and release in row["releases"]
