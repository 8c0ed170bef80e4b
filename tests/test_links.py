"""Links that break, through edgekit.sim.link (a relay between edgekit and a simulated board's sshd). A link cut
in the middle of a push: one sentence, the board serves what it served, and the next push resumes from what
arrived — the bytes that crossed before the cut are not sent again, but for what was still in flight. A board
partitioned away in the middle of a fleet rollout fails alone, with its reason, and the rest proceed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
from cli_helpers import edgekit, ok_json

from edgekit.config.boardfile import Boards
from edgekit.remote import hostkeys
from edgekit.sim import faults
from edgekit.sim.link import Link

IN_FLIGHT = 8 << 20  # what a cut may lose: TCP and ssh buffers between the relay and the board's disk


@pytest.fixture
def env(sim_session) -> dict[str, str]:
    return {**os.environ, **sim_session.env}


def via(sim_session, board_name: str, link: Link) -> str:
    """The board again, under another name, reached through ``link`` (its host key pinned for that port)."""
    boards = Boards(Path(sim_session.env["EDGEKIT_CONFIG"]))
    entry = boards.load().boards[board_name]
    name = f"{board_name}-via-link"
    boards.update(add={name: entry.model_copy(update={"port": link.port})})
    known = Path(sim_session.env["EDGEKIT_CONFIG_DIR"]) / "known_hosts"
    key = hostkeys.known_key(known, entry.host, entry.port)
    assert key is not None
    hostkeys.record(known, entry.host, link.port, key)
    return name


def test_a_push_cut_mid_blob_says_so_and_the_next_push_resumes_from_what_arrived(sim_session, env) -> None:
    (board,) = sim_session.boards(1, fresh=True)
    serving = ok_json(edgekit(env, "--json", "deploy", "--board", board.name, "--recipe", "sim-tiny-mtp"))["release"]
    with Link(board.port) as link:
        name = via(sim_session, board.name, link)
        pushing = subprocess.Popen([sys.executable, "-m", "edgekit", "push", "--board", name, "--recipe",
                                    "sim-gemma3-270m"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   text=True)
        cut_at = threading.Event()

        def cut_when_half_crossed() -> None:  # the 274 MB model is the big blob: cut inside it
            while pushing.poll() is None and link.sent_to_board < 120e6:
                time.sleep(0.005)
            link.cut()
            cut_at.set()

        threading.Thread(target=cut_when_half_crossed, daemon=True).start()
        _, err = pushing.communicate(timeout=600)
        crossed = link.sent_to_board
        assert cut_at.is_set() and pushing.returncode == 2, err[-3000:]
        assert "Traceback" not in err and "run the push again to resume" in err.strip().splitlines()[-1], err

        parts = {p.name: p.stat().st_size for p in (board.base / "store").glob("*.part")}
        assert len(parts) == 1, parts
        kept = next(iter(parts.values()))
        print(f"cut after {crossed / 1e6:.1f} MB crossed the link; the board kept {kept / 1e6:.1f} MB")
        assert crossed - IN_FLIGHT <= kept <= crossed
        assert os.readlink(board.base / "current") == f"releases/{serving}"

        again = ok_json(edgekit(env, "--json", "push", "--board", name, "--recipe", "sim-gemma3-270m"))
        blob = next(p for p in (board.base / "store").iterdir() if p.name == next(iter(parts))[: -len(".part")])
        assert not list((board.base / "store").glob("*.part"))
        assert again["bytes_sent"] <= blob.stat().st_size - kept + 2e6, json.dumps(again)  # + the small blobs


def playbook_started(proc: subprocess.Popen) -> None:
    me = psutil.Process(proc.pid)

    def is_playbook(child: psutil.Process) -> bool:
        try:
            return "ansible-playbook" in " ".join(child.cmdline()[:2])
        except psutil.Error:
            return False

    while not any(is_playbook(c) for c in me.children()):
        assert proc.poll() is None, "the rollout ended before its playbook started"
        time.sleep(0.01)


def test_a_board_partitioned_away_mid_rollout_fails_alone_and_the_rest_proceed(sim_session, env) -> None:
    away, other = sim_session.boards(2, fresh=True)
    with Link(away.port) as link:
        name = via(sim_session, away.name, link)
        boards = Boards(Path(sim_session.env["EDGEKIT_CONFIG"]))
        data = boards.load()
        data.groups["partition"] = [name, other.name]
        boards.save(data)
        rolling = subprocess.Popen([sys.executable, "-m", "edgekit", "--json", "fleet", "rollout", "--recipe",
                                    "sim-tiny-mtp", "--group", "partition", "--no-canary", "--max-fail", "50"],
                                   env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        playbook_started(rolling)
        link.partition()  # the board's link goes, and stays gone
        out, err = rolling.communicate(timeout=900)
    assert "Traceback" not in err, err[-3000:]
    report = json.loads(out)
    assert list(report["succeeded"]) == [other.name], report
    assert name in report["failed"] and report["failed"][name]["reason"], report["failed"]
    print(f"partitioned board: {report['failed'][name]['reason'][:200]}")
    assert faults.violations(other) == []
    assert faults.current(away) is None or faults.violations(away) == []  # nothing, or a whole checked release
