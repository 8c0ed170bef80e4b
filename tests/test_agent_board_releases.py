"""The activation program's release layout operations (agent/board_releases.py) do to a board exactly what
edgekit.remote.releases' shell does: each is run on two copies of the same layout and the trees compared."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from edgekit.agent.board_releases import Layout
from edgekit.remote import releases


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
        os.utime(base / "releases" / rid, (1_000_000 + n, 1_000_000 + n))
    pin = base / "pushed" / "r-d"
    pin.mkdir(parents=True)
    os.link(store / shas[3], pin / shas[3])
    (base / "pushed" / "r-e").mkdir()  # pins of a release not made yet: kept
    os.link(store / shas[4], base / "pushed" / "r-e" / shas[4])
    os.symlink("releases/r-c", base / "current")


def _tree(base: Path) -> list[str]:
    return sorted(f"{p.relative_to(base)}:{p.stat().st_nlink if p.is_file() else ''}" for p in base.rglob("*"))


def _copies(tmp_path: Path) -> tuple[Path, Path]:
    a, b = tmp_path / "sh", tmp_path / "py"
    _layout(a)
    _layout(b)
    assert _tree(a) == _tree(b)
    return a, b


@pytest.mark.parametrize("keep,protect", [(1, []), (2, ["r-a"]), (1, ["r-c", "r-b"]), (9, [])])
def test_prune_is_the_shell_prune(tmp_path: Path, keep: int, protect: list[str]) -> None:
    a, b = _copies(tmp_path)
    argv = ["sh", "-c", releases.PRUNE_SH, "edgekit-prune", str(a), str(keep), *protect]
    by_sh = subprocess.run(argv, capture_output=True, text=True, check=True).stdout.split()
    assert Layout(str(b)).prune(keep, protect) == by_sh
    assert _tree(a) == _tree(b)


def test_switch_serving_record_and_the_state_read_back(tmp_path: Path) -> None:
    a, b = _copies(tmp_path)
    subprocess.run(["sh", "-c", releases.SWITCH_SH, "edgekit-switch", str(a), "r-b"], check=True)
    subprocess.run(["sh", "-c", 'printf "%s\\n" "$2" > "$1/.serving.new" && mv -f "$1/.serving.new" "$1/serving"',
                    "edgekit-serving", str(a), "r-b"], check=True)
    health = {"ok": True, "reason": "healthy", "tokens": 8}
    subprocess.run(["sh", "-c", releases.RECORD_HEALTH_SH, "edgekit-health", str(a), "r-b",
                    json.dumps(health, sort_keys=True)], check=True)
    lay = Layout(str(b))
    lay.switch("r-b")
    lay.mark_serving("r-b")
    lay.record_health("r-b", health)
    assert _tree(a) == _tree(b)
    assert os.readlink(a / "current") == os.readlink(b / "current") == "releases/r-b"
    assert (a / "serving").read_text() == (b / "serving").read_text()
    assert (a / "releases/r-b/health.json").read_text() == (b / "releases/r-b/health.json").read_text()
    # Recording a check writes into the release's directory, which makes it the newest by mtime — as the
    # shell's record does (the same trees above); LIST_SH's order is the one read back.
    listed = subprocess.run(["sh", "-c", releases.LIST_SH, "edgekit-list", str(a)], capture_output=True, text=True,
                            check=True).stdout
    by_sh = [rid for _, rid in sorted((int(m), rid) for line in listed.splitlines() if line.startswith("release=")
                                      for m, rid in [line[len("release="):].split(" ", 1)])]
    assert lay.releases() == by_sh == ["r-a", "r-c", "r-d", "r-b"]
    assert (lay.current, lay.serving, lay.health("r-b"), lay.previous()) == ("r-b", "r-b", health, "r-d")
    with pytest.raises(FileNotFoundError, match="no release r-z"):
        lay.switch("r-z")
    assert os.readlink(b / "current") == "releases/r-b"  # untouched
