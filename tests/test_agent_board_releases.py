"""The activation program's release layout operations (agent/board_releases.py) on a board's tree: the prune
(newest by directory time, ties by id, never a protected one; pins of made releases and unlinked blobs go, an
upload in flight stays), switch, serving, the health record, and the state the host reads back through the agent's
release-list."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from edgekit.agent.board_releases import Layout
from edgekit.remote import releases
from edgekit.remote.runner import LocalRunner


def _layout(base: Path) -> None:
    store = base / "store"
    store.mkdir(parents=True)
    shas = {}
    for i in range(6):
        sha = f"{i:x}" * 64
        (store / sha).write_bytes(bytes([i]) * 10)
        shas[i] = sha
    (store / (shas[5] + ".part")).write_bytes(b"half")  # an upload in flight: never pruned
    for n, (rid, blobs) in enumerate({"r-a": [0, 1], "r-b": [1, 2], "r-c": [2, 3], "r-d": [3]}.items()):
        rdir = base / "releases" / rid / "bin"
        rdir.mkdir(parents=True)
        for b in blobs:
            os.link(store / shas[b], rdir / shas[b])
        (rdir.parent / "units.json").write_text(json.dumps({"edgekit-serve.service": {
            "unit": "edgekit-serve.service", "release": rid}}))
        os.utime(base / "releases" / rid, (1_000_000 + n, 1_000_000 + n))
    pin = base / "pushed" / "r-d"
    pin.mkdir(parents=True)
    os.link(store / shas[3], pin / shas[3])
    (base / "pushed" / "r-e").mkdir()  # pins of a release not made yet: kept
    os.link(store / shas[4], base / "pushed" / "r-e" / shas[4])
    os.symlink("releases/r-c", base / "current")


def _tree(base: Path) -> list[str]:
    return sorted(f"{p.relative_to(base)}:{p.stat().st_nlink if p.is_file() else ''}" for p in base.rglob("*"))


SHA = {i: f"{i:x}" * 64 for i in range(6)}
LINKS = {"r-a": [0, 1], "r-b": [1, 2], "r-c": [2, 3], "r-d": [3]}  # oldest first


@pytest.mark.parametrize("keep,protect,removed", [
    (1, [], ["r-a", "r-b", "r-c"]), (2, ["r-a"], ["r-b"]), (1, ["r-c", "r-b"], ["r-a"]), (9, [], [])])
def test_prune(tmp_path: Path, keep: int, protect: list[str], removed: list[str]) -> None:
    base = tmp_path / "b"
    _layout(base)
    assert Layout(str(base)).prune(keep, protect) == removed
    left = [rid for rid in LINKS if rid not in removed]
    assert sorted(p.name for p in (base / "releases").iterdir()) == left
    linked = {SHA[i] for rid in left for i in LINKS[rid]} | {SHA[4]}  # r-e's pin: its release is not made yet
    assert {p.name for p in (base / "store").iterdir()} == linked | {SHA[5] + ".part"}
    assert sorted(p.name for p in (base / "pushed").iterdir()) == ["r-e"]  # r-d exists: its pins went
    assert all((base / "store" / sha).stat().st_nlink > 1 for sha in linked)


def test_switch_serving_record_and_the_state_read_back(tmp_path: Path) -> None:
    b = tmp_path / "b"
    _layout(b)
    before = _tree(b)
    health = {"ok": True, "reason": "healthy", "tokens": 8}
    lay = Layout(str(b))
    lay.switch("r-b")
    lay.mark_serving("r-b")
    lay.record_health("r-b", health)
    added = sorted(set(_tree(b)) - set(before))
    assert added == ["releases/r-b/health.json:1", "serving:1"]  # current is the same link, renamed over
    assert os.readlink(b / "current") == "releases/r-b" and (b / "serving").read_text() == "r-b\n"
    assert json.loads((b / "releases/r-b/health.json").read_text()) == health
    assert not [p for p in b.rglob("*.new")]  # each written beside and renamed into place
    # Recording a check writes into the release's directory, which makes it the newest by mtime; the host reads the
    # same order back through the agent's release-list (remote.releases.layout).
    got = releases.layout(LocalRunner("here"), str(b))
    assert lay.releases() == got.releases == ["r-a", "r-c", "r-d", "r-b"]
    assert (got.current, got.serving, got.health) == ("r-b", "r-b", health)
    assert (lay.current, lay.serving, lay.health("r-b"), lay.previous()) == ("r-b", "r-b", health, "r-d")
    with pytest.raises(FileNotFoundError, match="no release r-z"):
        lay.switch("r-z")
    assert os.readlink(b / "current") == "releases/r-b"  # untouched


class _RefusingUnits:
    """systemd as the program sees it, with the first restart of ``refuse`` failing (a unit that would not start:
    an ExecStart the board cannot run). Records what the program asked, in order."""

    def __init__(self, refuse: str) -> None:
        self.refuse, self.calls = refuse, []

    def install(self, unit: str, spec: dict) -> None:
        self.calls.append(("install", unit, spec["release"]))

    def restart(self, unit: str, enable: bool = True) -> None:
        self.calls.append(("restart", unit))
        if unit == self.refuse and self.calls.count(("restart", unit)) == 1:
            raise RuntimeError(f"`systemctl restart {unit}` failed (exit 1)")

    def stop(self, unit: str) -> None:
        self.calls.append(("stop", unit))

    def remove(self, unit: str) -> None:
        self.calls.append(("remove", unit))

    def active(self, unit: str) -> bool:
        return False

    def claim(self, base: str) -> None:
        self.calls.append(("claim", Path(base).name))


def test_a_service_that_does_not_start_is_a_failed_check_and_the_previous_release_comes_back(tmp_path: Path) -> None:
    from edgekit.agent import activate, cli

    base = tmp_path / "b"
    _layout(base)
    args = cli.parser().parse_args(["activate", "--base", str(base), "--release", "r-d", "--port", "1",
                                    "--unit", "edgekit-serve.service", "--log", "x", "--legacy-unit", "old.service"])
    units = _RefusingUnits("edgekit-serve.service")
    said: list[tuple] = []
    out = activate.activate(args, units, say=lambda step, data=None: said.append((step, data)))  # type: ignore[arg-type]
    assert not out["ok"] and out["restored"] == "r-c" and out["strategy"] == "in-place"
    main = dict(said)["main"]
    assert not main["ok"] and main["reason"].startswith("the service did not start") and main["acceptance"] is None
    assert units.calls[-2:] == [("remove", "old.service"), ("restart", "edgekit-serve.service")]
    assert ("install", "edgekit-serve.service", "r-c") in units.calls  # the previous release, back in service
    assert os.readlink(base / "current") == "releases/r-c" and not (base / "releases/r-d/health.json").exists()
    assert sorted(p.name for p in (base / "releases").iterdir()) == ["r-a", "r-b", "r-c", "r-d"]  # no prune


def test_the_state_verb_reads_what_the_fleet_plays_act_on(tmp_path: Path, agent_pyz: Path) -> None:
    # The fleet's status and rollback plays read a board through the agent's `state` (action edgekit_agent).
    import subprocess
    import sys

    base = tmp_path / "b"
    _layout(base)
    (base / "releases" / "r-b" / "release.json").write_text(json.dumps({"recipe": "x", "port": 8080, "files": {}}))
    (base / "releases" / "r-c" / "agent").mkdir()
    (base / "releases" / "r-c" / "agent" / "activate.py").write_text("")
    (base / "serving").write_text("r-c\n")
    for n, rid in enumerate(LINKS):  # the writes above touched two releases' times: the order is by time
        os.utime(base / "releases" / rid, (1_000_000 + n, 1_000_000 + n))

    def state(*args: str) -> dict:
        res = subprocess.run([sys.executable, str(agent_pyz), "state", *args], capture_output=True, text=True,
                             check=False, timeout=60, env={**os.environ, "HOME": str(tmp_path)})
        assert res.returncode == 0, res.stderr
        return json.loads(res.stdout.strip().splitlines()[-1])

    got = state("~/b", "--release", "r-d", "--unit", "edgekit-nothing.service", "--older", "edgekit-neither.service")
    assert got["base"] == str(base) and got["current"] == got["serving"] == "r-c" and got["previous"] == "r-b"
    assert got["releases"] == list(LINKS) and got["has_release"] and got["programs"] == ["r-c"]
    assert got["manifests"]["previous"] == {"recipe": "x", "port": 8080}  # its file list dropped
    assert got["manifests"]["current"] == got["manifests"]["release"] == {} and got["active"] is False
    assert not state(str(base), "--release", "r-z")["has_release"]
