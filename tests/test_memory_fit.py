"""Memory checked before a byte is sent (edgekit.deploy.memory_fit): a simulated board whose kernel says little
memory is available refuses, in one sentence with the numbers, a release too big for it — a larger model, or the
same tiny one at a context whose KV cache does not fit — sends nothing and keeps serving; what fits deploys."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
import yaml
from cli_helpers import edgekit, ok_json

from edgekit.config.boardfile import Boards
from edgekit.sim.testing import SimBoard

REPO = Path(__file__).resolve().parents[1]
AVAILABLE_MB = 400


@pytest.fixture
def env(sim_session) -> dict[str, str]:
    return {**os.environ, **sim_session.env}


def leave_available(board: SimBoard, mb: int) -> None:
    """The board's other software has taken all but ``mb`` MB (its /proc/meminfo, as the probe reads it)."""
    meminfo = board.root / "proc" / "meminfo"
    meminfo.write_text(re.sub(r"MemAvailable:\s+\d+ kB", f"MemAvailable:   {mb * 1024} kB", meminfo.read_text()))


def tiny_at(tmp: Path, ctx_size: int) -> Path:
    data = yaml.safe_load((REPO / "edgekit" / "data" / "recipes" / "sim-tiny-mtp.yaml").read_text())
    data["name"] = f"sim-tiny-ctx{ctx_size}"
    data["runtime"]["ctx_size"] = ctx_size
    path = tmp / f"{data['name']}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_a_release_the_boards_memory_cannot_hold_is_refused_before_anything_is_sent(sim_session, env,
                                                                                       tmp_path) -> None:
    (board,) = sim_session.boards(1, fresh=True)
    serving = ok_json(edgekit("--json", "deploy", "--board", board.name, "--recipe", "sim-tiny-mtp",
                              env=env))["release"]
    leave_available(board, AVAILABLE_MB)
    blobs = sorted(p.name for p in (board.base / "store").iterdir())

    # The tiny release still fits (≈ 0.3 GB with the runtime): the redeploy changes nothing.
    again = ok_json(edgekit("--json", "deploy", "--board", board.name, "--recipe", "sim-tiny-mtp", env=env))
    assert again["release"] == serving and not again["changed"]

    # The tiny model's cache: 256 bytes a token on its full layers, its sliding ones hold a window: ≈ 270 MB at 1 M.
    for recipe, why in (("sim-gemma3-270m", "models 2"), (str(tiny_at(tmp_path, 1 << 20)), "KV cache 26")):
        res = edgekit("deploy", "--board", board.name, "--recipe", recipe, env=env)
        assert res.returncode == 2, res.stderr[-2000:]
        assert "Traceback" not in res.stderr
        line = res.stderr.strip().splitlines()[-1]  # after the steps it took (the release made, not sent)
        assert line.startswith("edgekit: Board "), res.stderr
        assert f"has {AVAILABLE_MB} MB of memory available but release" in line and why in line, line
        assert "nothing was sent and what the board serves is unchanged" in line, line
        assert sorted(p.name for p in (board.base / "store").iterdir()) == blobs  # not a byte
        assert os.readlink(board.base / "current") == f"releases/{serving}"

    st = ok_json(edgekit("--json", "status", "--board", board.name, env=env))
    assert st["current"] == serving and st["health"]["ok"]


def test_a_fleet_board_whose_memory_cannot_hold_the_release_fails_alone_and_is_sent_nothing(sim_session, env) -> None:
    roomy, tight = sim_session.boards(2, fresh=True)
    leave_available(tight, AVAILABLE_MB)
    boards = Boards(Path(sim_session.env["EDGEKIT_CONFIG"]))
    data = boards.load()
    data.groups["memtest"] = [roomy.name, tight.name]
    boards.save(data)
    res = edgekit("--json", "fleet", "rollout", "--recipe", "sim-gemma3-270m", "--group", "memtest",
                  "--no-canary", env=env)
    assert res.returncode != 0 and "Traceback" not in res.stderr, res.stderr[-3000:]
    report = json.loads(res.stdout)
    assert list(report["succeeded"]) == [roomy.name], report
    assert report["failed"][tight.name]["phase"] == "memory"
    reason = report["failed"][tight.name]["reason"]
    assert f"has {AVAILABLE_MB} MB of memory available but release" in reason and "models 2" in reason, reason
    assert not (tight.base / "store").exists() or not any((tight.base / "store").iterdir())
    assert (roomy.base / "current").is_symlink()


def test_a_published_recipe_too_big_for_the_board_is_refused_before_a_byte_is_downloaded(sim_session, env) -> None:
    """31b-mtp on an 8 GB Orin Nano: its size is known from the published structure, so the deploy stops before it
    downloads, builds or sends anything; on a 64 GB AGX Orin it goes on (to the download, which this machine's
    offline hub refuses: the memory was not the reason)."""
    offline = {**env, "HF_HUB_OFFLINE": "1"}
    (nano,) = sim_session.boards(1, "orin-nano-8gb")
    res = edgekit("deploy", "--board", nano.name, "--recipe", "31b-mtp", env=offline)
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr[-2000:]
    line = res.stderr.strip().splitlines()[-1]
    assert line.startswith(f"edgekit: Board '{nano.name}' has ") and "recipe '31b-mtp' needs ≈ 22" in line, line
    assert "nothing was downloaded, built or sent" in line and "its weights alone do not fit" in line, line
    store = nano.base / "store"
    assert "build llama.cpp" not in res.stderr and not (store.exists() and any(store.iterdir()))
    (agx,) = sim_session.boards(1, "orin", fresh=True)
    res = edgekit("deploy", "--board", agx.name, "--recipe", "31b-mtp", env=offline)
    assert res.returncode != 0 and "Traceback" not in res.stderr, res.stderr[-2000:]
    assert "memory: ≈ 22" in res.stderr and "MB of memory available but" not in res.stderr, res.stderr[-2000:]
    assert "HF_HUB_OFFLINE is set" in res.stderr.strip().splitlines()[-1], res.stderr[-2000:]
    # In a fleet the same board fails alone, in the memory phase, before anything is made for it.
    boards = Boards(Path(sim_session.env["EDGEKIT_CONFIG"]))
    data = boards.load()
    data.groups["small"] = [nano.name]
    boards.save(data)
    res = edgekit("--json", "fleet", "rollout", "--recipe", "31b-mtp", "--group", "small", "--no-canary", env=offline)
    assert res.returncode != 0 and "Traceback" not in res.stderr, res.stderr[-3000:]
    failed = json.loads(res.stdout)["failed"][nano.name]
    assert failed["phase"] == "memory" and "nothing was downloaded, built or sent" in failed["reason"], failed
