"""Links that break, through edgekit.sim.link (a relay between edgekit and a simulated board's sshd). A link cut
or stalled in the middle of a push: the push reconnects, takes the board's lock again and resumes from what
arrived — the bytes that crossed before the fault are not sent again, but for what was still in flight. A link
that stays down: one sentence after the retries, the board serves what it served, the next push resumes. A board
partitioned away in the middle of a fleet rollout fails alone, with its reason, and the rest proceed."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from cli_helpers import EDGEKIT, edgekit, ok_json

from edgekit.config.boardfile import Boards
from edgekit.sim import faults
from edgekit.sim.link import Link, route
from edgekit.store import sha256_file

IN_FLIGHT = 8 << 20  # what a cut may lose: TCP and ssh buffers between the relay and the board's disk


@pytest.fixture
def env(sim_session) -> dict[str, str]:
    return {**os.environ, **sim_session.env}


@contextlib.contextmanager
def via(sim_session, board_name: str, link: Link, **update: object) -> Iterator[str]:
    """The board under another name in the session's board file, through ``link``; the entry removed after (the
    session's board file is read by every test, the previous edgekit's in test_upgrade_from_legacy too)."""
    env = sim_session.env
    name = route(Path(env["EDGEKIT_CONFIG"]), Path(env["EDGEKIT_CONFIG_DIR"]) / "known_hosts", board_name, link,
                 **update)
    try:
        yield name
    finally:
        Boards(Path(env["EDGEKIT_CONFIG"])).update(remove=[name])


def store_sizes(board) -> dict[str, int]:
    store = board.base / "store"
    return {p.name: p.stat().st_size for p in store.iterdir()} if store.is_dir() else {}


def push_through(env: dict[str, str], name: str, link: Link, at_bytes: float, fault) -> tuple[subprocess.Popen, str,
                                                                                                 str, float]:
    """``edgekit --json push`` of the 274 MB release through ``link``; ``fault(link)`` once ``at_bytes`` crossed.
    (returncode, stdout, stderr, seconds from the fault to the end)."""
    pushing = subprocess.Popen([*EDGEKIT, "--json", "push", "--board", name, "--recipe",
                                "sim-gemma3-270m"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    fault_at: list[float] = []

    def inject() -> None:  # the 274 MB model is the big blob: the fault lands inside it
        while pushing.poll() is None and link.sent_to_board < at_bytes:
            time.sleep(0.005)
        fault(link)
        fault_at.append(time.monotonic())

    threading.Thread(target=inject, daemon=True).start()
    out, err = pushing.communicate(timeout=600)
    assert fault_at, f"the push ended before {at_bytes / 1e6:.0f} MB crossed: {err[-2000:]}"
    return pushing, out, err, time.monotonic() - fault_at[0]


def test_a_push_cut_mid_blob_resumes_on_a_new_connection_and_sends_only_what_had_not_arrived(sim_session, env) -> None:
    (board,) = sim_session.boards(1, fresh=True)
    serving = ok_json(edgekit("--json", "deploy", "--board", board.name, "--recipe", "sim-tiny-mtp",
                              env=env))["release"]
    before = store_sizes(board)
    with Link(board.port) as link, via(sim_session, board.name, link) as name:
        pushing, out, err, after_cut = push_through(env, name, link, 120e6, Link.cut)
        crossed = link.sent_to_board
    assert pushing.returncode == 0 and "Traceback" not in err, err[-3000:]
    assert json.loads(out)["link_retries"] == 1, out
    assert "the link broke" in err and "retry 1 of 3" in err, err[-2000:]
    new = {sha: size for sha, size in store_sizes(board).items() if sha not in before}
    assert not [n for n in new if n.endswith(".part")] and faults.violations(board) == []
    payload = sum(new.values())
    print(f"cut at 120 MB: {crossed / 1e6:.1f} MB crossed the link for {payload / 1e6:.1f} MB of new blobs; "
          f"done {after_cut:.1f} s after the cut")
    # What crossed twice is what was in flight at the cut, plus ssh's framing (GCM: ≈ 0.1 %) and the commands.
    assert payload <= crossed <= payload * 1.01 + IN_FLIGHT + 2e6
    assert os.readlink(board.base / "current") == f"releases/{serving}"


def test_a_stalled_link_is_given_up_after_stall_s_and_the_push_resumes(sim_session, env) -> None:
    (board,) = sim_session.boards(1, fresh=True)
    before = store_sizes(board)
    with Link(board.port) as link, via(sim_session, board.name, link, stall_s=6) as name:
        # Only the connections open now hang (a NAT that lost their state): new ones flow.
        pushing, out, err, after_stall = push_through(env, name, link, 60e6, lambda lk: lk.stall(existing_only=True))
    assert pushing.returncode == 0 and "Traceback" not in err, err[-3000:]
    assert json.loads(out)["link_retries"] == 1, out
    new = {sha: size for sha, size in store_sizes(board).items() if sha not in before}
    assert new and all(sha256_file(board.base / "store" / sha) == sha for sha in new), new  # no .part among them
    print(f"stall at 60 MB: the push finished {after_stall:.1f} s after it (stall_s 6; the lost session's lock "
          "freed by the board's sshd, 15 s)")
    # stall_s to notice (ssh keep-alives every 2 s), 1 s to wait, ≈ 15–20 s for the board's sshd to end the stalled
    # session that held the lock, then the rest of the blob: bounded (≈ 40 s here), where a hung push never ends.
    assert after_stall < 120


def test_a_push_whose_link_stays_down_gives_up_in_one_sentence_and_the_next_push_resumes(sim_session, env) -> None:
    (board,) = sim_session.boards(1, fresh=True)
    serving = ok_json(edgekit("--json", "deploy", "--board", board.name, "--recipe", "sim-tiny-mtp",
                              env=env))["release"]
    with Link(board.port) as link, via(sim_session, board.name, link) as name:
        pushing, _, err, _ = push_through(env, name, link, 120e6, Link.partition)
        crossed = link.sent_to_board
        assert pushing.returncode == 2 and "Traceback" not in err, err[-3000:]
        last = err.strip().splitlines()[-1]
        assert "gave up after 3 retries" in last and "run the push again to resume" in last, err[-2000:]

        parts = {p.name: p.stat().st_size for p in (board.base / "store").glob("*.part")}
        assert len(parts) == 1, parts
        kept = next(iter(parts.values()))
        print(f"partitioned after {crossed / 1e6:.1f} MB crossed the link; the board kept {kept / 1e6:.1f} MB")
        assert crossed - IN_FLIGHT <= kept <= crossed
        assert os.readlink(board.base / "current") == f"releases/{serving}"

        link.heal()
        again = ok_json(edgekit("--json", "push", "--board", name, "--recipe", "sim-gemma3-270m", env=env))
    blob = board.base / "store" / next(iter(parts))[: -len(".part")]
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
    with Link(away.port) as link, via(sim_session, away.name, link) as name:
        boards = Boards(Path(sim_session.env["EDGEKIT_CONFIG"]))
        data = boards.load()
        data.groups["partition"] = [name, other.name]
        boards.save(data)
        rolling = subprocess.Popen([*EDGEKIT, "--json", "fleet", "rollout", "--recipe",
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


def test_a_fleet_rollout_cut_mid_blob_resumes_on_the_next_rollout_and_sends_the_blob_about_once(sim_session,
                                                                                                  env) -> None:
    # The fleet's push is the agent's `receive`, as deploy's is: what reached the board's disk before a cut stays in
    # its .part, and the next rollout sends only the rest.
    (board,) = sim_session.boards(1, fresh=True)
    with Link(board.port) as link, via(sim_session, board.name, link) as name:
        boards = Boards(Path(sim_session.env["EDGEKIT_CONFIG"]))
        data = boards.load()
        data.groups["cutfleet"] = [name]
        boards.save(data)
        argv = [*EDGEKIT, "--json", "fleet", "rollout", "--recipe", "sim-gemma3-270m", "--group", "cutfleet",
                "--no-canary"]
        rolling = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        while rolling.poll() is None and link.sent_to_board < 0.6 * 274e6:  # 60 % into the 274 MB model
            time.sleep(0.005)
        link.cut()
        out, err = rolling.communicate(timeout=900)
        assert "Traceback" not in err, err[-3000:]
        assert name in json.loads(out)["failed"], out[-2000:]
        parts = {sha: size for sha, size in store_sizes(board).items() if sha.endswith(".part")}
        assert parts and max(parts.values()) > 50e6, parts  # what arrived before the cut is kept
        again = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900, check=False)
        assert again.returncode == 0, again.stderr[-3000:] + again.stdout[-2000:]
        crossed = link.sent_to_board
        data = boards.load()
        data.groups.pop("cutfleet", None)
        boards.save(data)
    payload = sum(size for sha, size in store_sizes(board).items() if not sha.endswith(".part"))
    print(f"fleet rollout cut at 60 % of the model, then rolled out again: {crossed / 1e6:.1f} MB crossed the link "
          f"for {payload / 1e6:.1f} MB of blobs ({crossed / payload:.3f}×)")
    assert payload <= crossed <= 1.05 * payload
    assert faults.violations(board) == []
