"""A board the previous edgekit deployed is upgraded by this one and still rolls back to its old release.

The previous edgekit (LEGACY_REF, taken from this repository's history) ran every engine as
`edgekit-llama.service`, logging to `llama-server.log`, and activated from the host. This edgekit's board-side
program starts `edgekit-serve.service`, stops and removes the old unit as it does; a rollback to the old release
(which carries unit text, not a unit spec) is refused in one sentence, and the board keeps serving.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
from pathlib import Path

import pytest
import yaml
from build_helpers import sdist_or_skip
from cli_helpers import edgekit
from test_deploy import complete, deploy, recipe_variant, status

REPO = Path(__file__).resolve().parents[1]
LEGACY_REF = "491d7d5"  # the last commit whose service was edgekit-llama.service
UNITS = "etc/systemd/system"


@pytest.fixture
def boards(sim_boards, monkeypatch):
    monkeypatch.setenv("EDGEKIT_LLAMA_SRC", str(sdist_or_skip()))
    return sim_boards


def _legacy_tree(tmp: Path) -> Path:
    """The previous edgekit's package, from git (a checkout without that history cannot run this test)."""
    tree = tmp / "legacy-edgekit"
    tree.mkdir()
    archive = subprocess.run(["git", "-C", str(REPO), "archive", "--format=tar", LEGACY_REF, "edgekit"],
                             capture_output=True, check=False)
    if archive.returncode != 0:
        pytest.skip(f"this checkout lacks commit {LEGACY_REF} (a shallow clone?): {archive.stderr.decode()[:200]}")
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
    return tree


def _legacy_board_file(tree: Path, board: str) -> Path:
    """The board as the previous edgekit's board file had it: no engine sections (it had none, and refuses
    unknown keys)."""
    data = yaml.safe_load(Path(os.environ["EDGEKIT_CONFIG"]).read_text())
    entry = {k: v for k, v in data["boards"][board].items() if not isinstance(v, dict)}
    path = tree.parent / "legacy-edgekit.yaml"
    path.write_text(yaml.safe_dump({"boards": {board: entry}}))
    return path


def _legacy_recipe(path: Path) -> Path:
    """A recipe as the previous edgekit read it: llama.cpp's settings at the top of runtime, not in a section."""
    data = yaml.safe_load(path.read_text())
    data["runtime"].update(data["runtime"].pop("llama_cpp", {}))
    out = path.with_name(f"legacy-{path.name}")
    out.write_text(yaml.safe_dump(data))
    return out


def _legacy_deploy(tree: Path, board: str, recipe: str) -> dict:
    # Run from outside the checkout: `python -m` puts the working directory first on sys.path. It builds from
    # the tree this edgekit builds from (edgekit's patches applied: they only add), so the shared build
    # directory holds one source and neither edgekit compiles llama.cpp again for the other (minutes each).
    from edgekit.build.source import resolve_source

    env = {**os.environ, "PYTHONPATH": str(tree), "EDGEKIT_CONFIG": str(_legacy_board_file(tree, board)),
           "EDGEKIT_LLAMA_SRC": str(resolve_source(os.environ["EDGEKIT_LLAMA_SRC"]).path)}
    res = edgekit("--json", "deploy", "--board", board, "--recipe", recipe, env=env, timeout=900, cwd=tree)
    assert res.returncode == 0, res.stderr[-2000:]
    return json.loads(res.stdout)


def test_a_board_the_previous_edgekit_deployed_is_upgraded_and_rolls_back(boards, tmp_path: Path) -> None:
    (board,) = boards(1, fresh=True)
    units = board.root / UNITS
    old = _legacy_deploy(_legacy_tree(tmp_path), board.name, "sim-tiny-mtp")
    assert old["health"]["ok"] and (units / "edgekit-llama.service").is_file()
    assert (board.base / "releases" / old["release"] / "edgekit-llama.service").is_file()
    assert board.run("systemctl is-active --quiet edgekit-llama.service").rc == 0

    # The upgrade: the old unit counts as the service (so the new release is first checked as a candidate),
    # and it is stopped and removed as the new one starts.
    new = deploy(board.name, "sim-tiny-mtp")
    assert new["changed"] and new["previous"] == old["release"] != new["release"]
    assert new["strategy"] == "candidate" and new["health"]["ok"] and new["health"]["draft_n"] > 0
    assert not (units / "edgekit-llama.service").exists() and (units / "edgekit-serve.service").is_file()
    assert board.run("systemctl is-active --quiet edgekit-serve.service").rc == 0
    assert board.run("systemctl is-active --quiet edgekit-llama.service").rc != 0
    assert (board.base / "logs" / "server.log").is_file()
    now = status(board.name)
    assert now["current"] == new["release"] and now["health"]["ok"]

    # Back to the release the previous edgekit made: refused in one sentence (it carries unit text, which is never
    # installed: units come from specs), before anything on the board is touched.
    unit_before = (units / "edgekit-serve.service").read_text()
    res = edgekit("rollback", "--board", board.name, timeout=900)
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr[-2000:]
    assert len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert f"Release {old['release']} on board {board.name!r} was made by an earlier edgekit" in res.stderr
    assert "redeploy it (edgekit deploy" in res.stderr
    assert status(board.name)["current"] == new["release"]
    assert (units / "edgekit-serve.service").read_text() == unit_before
    assert complete(board.service_port)["content"] is not None

    # And a deploy again changes nothing.
    again = deploy(board.name, "sim-tiny-mtp")
    assert not again["changed"] and again["release"] == new["release"]


def _answers(host: str, port: int) -> bool:
    """Does anything accept a connection on host:port (127.0.0.2 stands for another machine on the network)?"""
    try:
        with socket.create_connection((host, port), timeout=5):
            return True
    except OSError:
        return False


def test_a_board_the_previous_edgekit_left_open_to_the_network_is_moved_to_loopback(boards, tmp_path: Path) -> None:
    (board,) = boards(1, fresh=True)
    open_recipe = recipe_variant(tmp_path, "sim-tiny-mtp", "sim-tiny-mtp-open", host="0.0.0.0")
    old = _legacy_deploy(_legacy_tree(tmp_path), board.name, str(_legacy_recipe(open_recipe)))
    assert old["health"]["ok"] and _answers("127.0.0.2", board.service_port)  # anyone on the network, no key

    # Today's edgekit refuses that recipe in one sentence, before anything is sent: the board is as it was.
    releases = sorted(p.name for p in (board.base / "releases").iterdir())
    res = edgekit("deploy", "--board", board.name, "--recipe", str(open_recipe), timeout=900)
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr[-2000:]
    assert "0.0.0.0 would serve the model to every machine that reaches the board, with no key" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert sorted(p.name for p in (board.base / "releases").iterdir()) == releases
    assert status(board.name)["current"] == old["release"] and _answers("127.0.0.2", board.service_port)

    # The built-in recipe serves on the board's loopback; the deploy that moves the board there says so.
    new = deploy(board.name, "sim-tiny-mtp")
    assert new["changed"] and new["previous"] == old["release"] and new["health"]["ok"]
    (note,) = new["notes"]
    assert f"({old['release']}) served on 0.0.0.0 with no key" in note and "loopback only (127.0.0.1)" in note
    assert not _answers("127.0.0.2", board.service_port) and complete(board.service_port)["content"] is not None
    again = deploy(board.name, "sim-tiny-mtp")
    assert not again["changed"] and again["notes"] == []

    # Rolling back to the old release (which served the network with no key) is refused: it is redeployed or not
    # at all, and the board stays on loopback.
    res = edgekit("--json", "rollback", "--board", board.name, timeout=900)
    assert res.returncode == 2 and "was made by an earlier edgekit" in res.stderr, res.stderr[-2000:]
    assert not _answers("127.0.0.2", board.service_port) and complete(board.service_port)["content"] is not None
