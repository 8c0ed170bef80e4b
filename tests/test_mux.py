"""edgekit's commands over one OpenSSH master per board (a fleet run's connection), against a sim board."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import psutil
import pytest

from edgekit.config.boardfile import Board, Boards
from edgekit.errors import EdgekitError
from edgekit.remote import mux
from edgekit.remote.http import request
from edgekit.remote.lock import BoardLock
from edgekit.remote.probe import probe


def _entry(board_name: str) -> Board:
    return Boards(Path(os.environ["EDGEKIT_CONFIG"])).load().boards[board_name]


def test_one_master_carries_commands_the_lock_and_http(sim_boards, tmp_path: Path) -> None:
    (sim,) = sim_boards(1)
    entry = _entry(sim.name)
    logins = sim.logins()
    with mux.control_dir() as control:
        runner = mux.MuxRunner(entry, sim.name, control)
        assert probe(runner, entry.base).arch
        odd = "a b'c $(touch PWNED) ;x"  # one argument, never parsed by the board's shell
        res = runner.run(["sh", "-c", 'printf %s "$1"; exit 4', "sh", odd], check=False)
        assert (res.exit_code, res.stdout) == (4, odd)
        base = str(tmp_path / "lockbase")
        with BoardLock(runner, base), pytest.raises(EdgekitError, match="Another deploy holds"):
            BoardLock(runner, base).__enter__()
        with BoardLock(runner, base):  # released on exit: taken again at once
            pass
        with socket.socket() as s:  # a port nothing listens on
            s.bind(("127.0.0.1", 0))
            free = s.getsockname()[1]
        with pytest.raises(ConnectionError, match="nothing answers"):
            request(runner, free, "GET", "/health", timeout=5)
        runner.close()
        masters = [p for p in psutil.process_iter(["cmdline"]) if str(control) in " ".join(p.info["cmdline"] or [])]
        assert len(masters) == 1
    # All of it was one login, and the master is gone with its control dir.
    assert sim.logins() == logins + 1
    deadline = time.monotonic() + 5
    while masters[0].is_running() and masters[0].status() != psutil.STATUS_ZOMBIE and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not masters[0].is_running() or masters[0].status() == psutil.STATUS_ZOMBIE
    assert not control.exists()


def test_a_master_that_cannot_be_made_says_why_in_one_sentence(sim_boards, tmp_path: Path) -> None:
    (sim,) = sim_boards(1)
    entry = _entry(sim.name)
    (tmp_path / "empty_known_hosts").write_text("")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    with mux.control_dir() as control:
        with pytest.raises(EdgekitError, match=r"Cannot reach board 'x' .*Connection refused\.$"):
            mux.MuxRunner(entry.model_copy(update={"port": dead}), "x", control).run(["true"])
        # An unknown host key: the same sentence as edgekit's own connections, with the offered fingerprint.
        with pytest.raises(EdgekitError, match=r"is not trusted yet: its host key ssh-ed25519 SHA256:"):
            mux.MuxRunner(entry.model_copy(update={"known_hosts": str(tmp_path / "empty_known_hosts")}), "x",
                          control).run(["true"])
        assert list(control.iterdir()) == []
