"""SSH policy and probe against real sshd boards: pinned keys only, clear refusals, isolation."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import paramiko
from cli_helpers import edgekit

from edgekit.remote import hostkeys


def test_probe_reads_each_boards_own_jetson_files(sim_boards) -> None:
    a, b = sim_boards(2)
    (thor,) = sim_boards(1, "thor")
    facts = {x.name: json.loads(edgekit("board", "probe", "--board", x.name, "--json", timeout=120).stdout)
             for x in (a, b, thor)}
    fa, ft = facts[a.name], facts[thor.name]
    for key in ("board", "model", "l4t", "cuda", "arch", "mem_total_mb", "disk_free_mb", "python", "jtop",
                "power_rails"):
        assert key in fa
    assert fa["model"] == "NVIDIA Jetson AGX Orin Developer Kit" and fa["l4t"].startswith("36.")
    assert re.fullmatch(r"3\.\d+\.\d+", fa["python"]), fa["python"]
    assert fa["arch"] == os.uname().machine and fa["mem_total_mb"] > 0 and fa["disk_free_mb"] > 0
    assert fa["jetpack"].startswith("6") and fa["cuda"].startswith("12.6")
    assert "VIN_SYS_5V0" in fa["power_rails"] and ft["power_rails"] == ["VIN"]
    assert ft["l4t"].startswith("38.") and ft["cuda"].startswith("13.0") and ft["mem_total_mb"] > 100_000
    assert fa["base"] == str(a.base) and facts[b.name]["base"] == str(b.base) and a.base != b.base
    # Which agents the board holds: this edgekit's once anything of edgekit ran there (the probe sends none).
    assert fa["agent"]["this"].startswith("edgekit-agent-") and isinstance(fa["agent"]["held"], list)
    assert fa["agent"]["current"] == (fa["agent"]["this"] in fa["agent"]["held"])
    # A file written on one board is not on the other.
    assert a.run(f"mkdir -p {a.base} && echo only-a > {a.base}/marker").rc == 0
    assert b.run(f"test -e {b.base}/marker").rc != 0


def test_unknown_host_key_is_refused_then_trusted(sim_boards, tmp_path: Path) -> None:
    (board,) = sim_boards(1, fresh=True)
    pinned = hostkeys.known_key(board.known_hosts, board.host, board.port)
    assert pinned is not None
    hostkeys.forget(board.known_hosts, board.host, board.port)
    try:
        res = edgekit("board", "probe", "--board", board.name, timeout=120)
        assert res.returncode == 2 and "Traceback" not in res.stderr
        assert "not trusted yet" in res.stderr and hostkeys.fingerprint(pinned) in res.stderr
        assert f"edgekit board trust --board {board.name}" in res.stderr
        # No terminal and no --yes: nothing is trusted.
        res = edgekit("board", "trust", "--board", board.name, timeout=120)
        assert res.returncode == 2 and "--yes" in res.stderr
        assert hostkeys.known_key(board.known_hosts, board.host, board.port) is None
        # A wrong expected fingerprint is refused.
        res = edgekit("board", "trust", "--board", board.name, "--fingerprint", "SHA256:wrong", timeout=120)
        assert res.returncode == 2 and "not the expected" in res.stderr
        res = edgekit("board", "trust", "--board", board.name, "--fingerprint", hostkeys.fingerprint(pinned),
                      "--json", timeout=120)
        assert res.returncode == 0, res.stderr
        assert json.loads(res.stdout)["status"] == "new"
    finally:
        hostkeys.record(board.known_hosts, board.host, board.port, pinned)
    assert edgekit("board", "probe", "--board", board.name, timeout=120).returncode == 0


def test_changed_host_key_is_refused_naming_the_file(sim_boards) -> None:
    (board,) = sim_boards(1, fresh=True)
    real = hostkeys.known_key(board.known_hosts, board.host, board.port)
    impostor = paramiko.Ed25519Key.from_private_key_file(str(board.key))  # any other ed25519 key
    hostkeys.record(board.known_hosts, board.host, board.port, impostor)
    try:
        res = edgekit("board", "probe", "--board", board.name, timeout=120)
        assert res.returncode == 2 and "CHANGED" in res.stderr and str(board.known_hosts) in res.stderr
        res = edgekit("board", "trust", "--board", board.name, "--yes", timeout=120)
        assert res.returncode == 2 and "--replace" in res.stderr
    finally:
        hostkeys.record(board.known_hosts, board.host, board.port, real)


def test_unreachable_and_bad_key_are_one_line(sim_boards, tmp_path: Path) -> None:
    import yaml

    (board,) = sim_boards(1)
    cfg = Path(__import__("os").environ["EDGEKIT_CONFIG"])
    data = yaml.safe_load(cfg.read_text())
    entry = dict(data["boards"][board.name])
    alt = tmp_path / "alt.yaml"
    dead = dict(entry, port=1)
    nokey = dict(entry, key=str(tmp_path / "missing_key"))
    alt.write_text(yaml.safe_dump({"boards": {"dead": dead, "nokey": nokey}}))
    res = edgekit("--config", str(alt), "board", "probe", "--board", "dead", timeout=120)
    assert res.returncode == 2 and "Cannot reach" in res.stderr and res.stderr.count("\n") == 1
    res = edgekit("--config", str(alt), "board", "probe", "--board", "nokey", timeout=120)
    assert res.returncode == 2 and "does not exist" in res.stderr


def test_ctrl_c_during_a_remote_command_is_not_lost(sim_session, monkeypatch) -> None:
    """A Ctrl-C that lands while a command runs on the board reaches edgekit (Fabric re-raises it without a pty)
    once the command's output is in, and the connection still works afterwards."""
    import os
    import signal
    import threading
    import time

    import pytest

    from edgekit.config.boardfile import Boards
    from edgekit.remote.runner import SshRunner

    (board,) = sim_session.boards(1)
    for key, value in sim_session.env.items():
        monkeypatch.setenv(key, value)
    runner = SshRunner(Boards(Path(sim_session.env["EDGEKIT_CONFIG"])).load().boards[board.name], board.name)
    # Python's own handler, whatever this test process inherited (a background job starts with SIGINT ignored).
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        assert runner.run(["true"]).ok  # connected before the clock starts
        threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT)).start()
        start = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            runner.run(["sleep", "1.5"])
        assert time.monotonic() - start >= 1.4  # raised once the command was back
        assert runner.run(["true"]).ok  # the connection still works
    finally:
        signal.signal(signal.SIGINT, old)
        runner.close()
