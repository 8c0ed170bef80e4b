"""`edgekit board verify`: every blob of a board's store hashed again (a disk that rots keeps sizes and times), the
releases that hold a bad one named, and with --repair the bad copies no current release holds deleted and the
releases that are not current and hold one removed; the current release, which the service runs, is kept."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from cli_helpers import edgekit

if TYPE_CHECKING:
    from conftest import SimSession


def _store(base: Path) -> dict[str, str]:
    """Three blobs; r1 (older) holds a and b, r2 (current) holds b and c. Then b and c rot at rest: b in both
    releases, c in the current one only; a stays good."""
    store = base / "store"
    store.mkdir(parents=True)
    shas = {}
    for name in "abc":
        data = name.encode() * 4096
        sha = hashlib.sha256(data).hexdigest()
        (store / sha).write_bytes(data)
        shas[name] = sha
    for n, (rid, names) in enumerate((("r1", "ab"), ("r2", "bc"))):
        models = base / "releases" / rid / "models"
        models.mkdir(parents=True)
        for name in names:
            os.link(store / shas[name], models / f"{name}.gguf")
        os.utime(base / "releases" / rid, (1_000_000 + n, 1_000_000 + n))
    os.symlink("releases/r2", base / "current")
    for name in "bc":  # in place: the same inode, as a bad sector is
        with open(store / shas[name], "r+b") as fh:
            fh.seek(100)
            fh.write(b"\xff")
    return shas


def _verify(agent_pyz: Path, base: Path, *args: str) -> dict:
    res = subprocess.run([sys.executable, str(agent_pyz), "verify-store", str(base), *args], capture_output=True,
                         text=True, check=False, timeout=60)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def test_the_agent_finds_rot_names_its_holders_and_repairs_what_does_not_serve(agent_pyz: Path,
                                                                               tmp_path: Path) -> None:
    base = tmp_path / "b"
    shas = _store(base)
    got = _verify(agent_pyz, base)
    assert got["checked"] == 3 and got["current"] == "r2" and got["current_corrupt"] and not got["repaired"]
    bad = {b["sha256"]: b for b in got["bad"]}
    assert set(bad) == {shas["b"], shas["c"]}
    assert bad[shas["b"]]["releases"] == {"r1": ["models/b.gguf"], "r2": ["models/b.gguf"]}
    assert bad[shas["c"]]["releases"] == {"r2": ["models/c.gguf"]} and not any(b["deleted"] for b in got["bad"])
    assert sorted(p.name for p in (base / "store").iterdir()) == sorted(shas.values())  # reading only

    fixed = _verify(agent_pyz, base, "--repair")
    assert fixed["releases_dropped"] == ["r1"] and not (base / "releases" / "r1").exists()
    # Both bad blobs are held by the current release: kept, with it (the service runs it), and reported.
    assert (base / "releases" / "r2").is_dir() and (base / "store" / shas["b"]).exists()
    assert all(b["current_holds_it"] and not b["deleted"] for b in fixed["bad"])


def test_a_bad_blob_no_current_release_holds_is_deleted(agent_pyz: Path, tmp_path: Path) -> None:
    base = tmp_path / "b"
    shas = _store(base)
    (base / "current").unlink()
    os.symlink("releases/r1", base / "current")  # r1 current: c is held by r2 alone
    fixed = _verify(agent_pyz, base, "--repair")
    bad = {b["sha256"]: b for b in fixed["bad"]}
    assert bad[shas["c"]]["deleted"] and not (base / "store" / shas["c"]).exists()
    assert not bad[shas["b"]]["deleted"] and fixed["releases_dropped"] == ["r2"]
    assert (base / "store" / shas["a"]).exists() and (base / "releases" / "r1").is_dir()


def test_board_verify_over_ssh_exits_1_and_says_what_to_do(sim_session: SimSession) -> None:
    (board,) = sim_session.boards(1, fresh=True)
    base = Path(board.base)
    _store(base)
    env = {**os.environ, **sim_session.env}
    res = edgekit("--json", "board", "verify", "--board", board.name, env=env, timeout=300)
    assert res.returncode == 1, res.stderr[-2000:]
    got = json.loads(res.stdout)
    assert got["board"] == board.name and len(got["bad"]) == 2 and got["current_corrupt"]
    human = edgekit("board", "verify", "--board", board.name, "--repair", env=env, timeout=300)
    assert human.returncode == 1 and "edgekit rollback --board" in human.stdout, human.stdout + human.stderr
    assert not (base / "releases" / "r1").exists()
