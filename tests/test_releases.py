"""The board's release layout: the host's scripts (sh, stat, find) and the board program's prune, run here as
they run on a board."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from edgekit.agent.board_releases import Layout
from edgekit.remote import releases
from edgekit.remote.runner import LocalRunner


def _board(base: Path, ages: dict[str, int]) -> dict[str, str]:
    """Releases named in ``ages`` (seconds old), each linking one blob of its own and one shared blob."""
    store = base / "store"
    store.mkdir(parents=True)
    runner = LocalRunner("here")
    shas = {}
    for data in [b"shared", *(rid.encode() for rid in ages)]:
        sha = hashlib.sha256(data).hexdigest()
        (store / sha).write_bytes(data)
        shas[data.decode()] = sha
    for rid, age in ages.items():
        assert releases.create(runner, str(base), rid, {"models/own.bin": shas[rid], "lib/shared.so": shas["shared"]})
        t = 1_900_000_000 - age
        os.utime(base / "releases" / rid, (t, t))
    return shas


def test_prune_keeps_the_newest_and_the_protected_and_drops_unlinked_blobs(tmp_path: Path) -> None:
    base = tmp_path / "base"
    # r-b and r-c are equally old: layout() orders ties by id, and so must the board.
    ages = {"r-a": 50, "r-c": 40, "r-b": 40, "r-d": 30, "r-e": 20, "r-f": 10}
    shas = _board(base, ages)
    runner = LocalRunner("here")
    assert releases.layout(runner, str(base)).releases == ["r-a", "r-b", "r-c", "r-d", "r-e", "r-f"]
    removed = Layout(str(base)).prune(2, ["r-b", ""])
    assert removed == ["r-a", "r-c", "r-d"]
    assert sorted(p.name for p in (base / "releases").iterdir()) == ["r-b", "r-e", "r-f"]
    left = {p.name for p in (base / "store").iterdir()}
    assert left == {shas[k] for k in ("shared", "r-b", "r-e", "r-f")}
    assert Layout(str(base)).prune(3, []) == []  # nothing more to remove


def test_prune_refuses_to_keep_nothing_and_bad_ids_name_no_path(tmp_path: Path) -> None:
    base = tmp_path / "base"
    _board(base, {"r-a": 2, "r-b": 1})
    with pytest.raises(ValueError, match="at least one"):
        Layout(str(base)).prune(0, [])
    # A protected id that is no release's name is never read as a path: nothing outside releases/ goes.
    assert Layout(str(base)).prune(1, ["../x", "../../base"]) == ["r-a"]
    assert (base / "store").is_dir() and (base / "releases" / "r-b").is_dir()
