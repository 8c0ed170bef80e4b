"""A link cut in the middle of a push (edgekit.sim.link: a relay between edgekit and a simulated board's sshd,
reset at once as a dropped Wi-Fi resets it): one sentence, the board serves what it served, and the next push
resumes from what arrived — the bytes that crossed the link before the cut are not sent again, but for what was
still in flight."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from cli_helpers import edgekit, ok_json

from edgekit.config.boardfile import Boards
from edgekit.remote import hostkeys
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
