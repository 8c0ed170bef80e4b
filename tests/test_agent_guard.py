"""The agent's ``guard`` (agent/guard.py), run as a board runs it: ``python3 <zipapp> guard ...``, its stdin the
channel. The deploy lock, the power-mode guard and the bench guard are this one verb."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from edgekit.remote import agent_ship
from edgekit.remote.channel_guard import ChannelGuard, GuardRefused, guard_args
from edgekit.remote.runner import LocalRunner

PYTHON3 = "/usr/bin/python3"


@pytest.fixture
def pyz(agent_pyz: Path) -> Path:
    return agent_pyz


def start(pyz: Path, *args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([PYTHON3, str(pyz), "guard", *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)


def first(proc: subprocess.Popen[bytes]) -> dict:
    assert proc.stdout is not None
    return json.loads(proc.stdout.readline())


def test_a_guard_holds_its_lock_while_the_channel_lives_and_undoes_when_it_closes(pyz: Path, tmp_path: Path) -> None:
    lock, mark = tmp_path / "b" / ".deploy.lock", tmp_path / "undone"
    one = start(pyz, "--lock", str(lock), "--undo", json.dumps(["touch", str(mark)]),
                "--undo", json.dumps(["sh", "-c", "exit 3"]))
    assert first(one) == {"armed": True}
    two = start(pyz, "--lock", str(lock), "--wait", "0.3")
    assert first(two) == {"armed": False, "busy": str(lock)} and two.wait(10) == 75
    assert not mark.exists()
    out, _ = one.communicate(b"", timeout=30)  # the channel closes: the undo runs, in order, whatever each exits
    assert mark.exists() and json.loads(out)["undone"][1]["exit"] == 3 and one.returncode == 0
    three = start(pyz, "--lock", str(lock))
    assert first(three) == {"armed": True}  # the lock went with the process
    three.communicate(b"", timeout=30)


def test_a_guard_whose_holder_is_killed_still_undoes(pyz: Path, tmp_path: Path) -> None:
    # The holder (edgekit) is SIGKILLed: the kernel closes its end of the pipe, as sshd closes a channel.
    mark = tmp_path / "undone"
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; sys.stdout.write('x'); sys.stdout.flush(); "
                               "time.sleep(600)"], stdout=subprocess.PIPE)
    assert holder.stdout is not None and holder.stdout.read(1) == b"x"
    guard = subprocess.Popen([PYTHON3, str(pyz), "guard", "--undo", json.dumps(["touch", str(mark)])],
                             stdin=holder.stdout, stdout=subprocess.PIPE)
    assert first(guard) == {"armed": True}
    holder.stdout.close()
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait()
    guard.wait(30)
    assert mark.exists()


def test_an_activation_still_running_is_waited_for_and_a_bad_undo_refused(pyz: Path, tmp_path: Path) -> None:
    act = tmp_path / ".activate.lock"
    holder = start(pyz, "--lock", str(act))
    assert first(holder) == {"armed": True}
    t0 = time.monotonic()
    waiting = start(pyz, "--wait", "0", "--await", str(act))
    time.sleep(1.0)
    holder.communicate(b"", timeout=30)  # the activation ends: the waiting guard arms
    assert first(waiting) == {"armed": True} and time.monotonic() - t0 >= 1.0
    waiting.communicate(b"", timeout=30)
    bad = subprocess.run([PYTHON3, str(pyz), "guard", "--undo", "rm -rf /"], capture_output=True, check=False)
    assert bad.returncode == 2 and b"not JSON" in bad.stderr


def test_the_workstation_side_arms_and_releases_through_a_runner(tmp_path: Path) -> None:
    runner = LocalRunner("here")
    root, mark = str(tmp_path / "base"), tmp_path / "undone"
    lock = f"{root}/.deploy.lock"
    with ChannelGuard(runner, root, guard_args([lock], undo=[["touch", str(mark)]])):
        with pytest.raises(GuardRefused) as busy:
            ChannelGuard(runner, root, guard_args([lock])).__enter__()
        assert busy.value.busy == lock
        assert not mark.exists()
    assert mark.exists()
    assert (tmp_path / "base" / "agent" / agent_ship.app().name).is_file()  # sent once, under the base


def test_a_guard_stops_the_processes_working_under_its_directory_before_its_undo(pyz: Path, tmp_path: Path) -> None:
    work = tmp_path / "bench" / "run-1"
    (work / "jobs").mkdir(parents=True)
    idle = [sys.executable, "-c", "import time; time.sleep(600)"]
    job = subprocess.Popen([*idle, str(work / "jobs" / "load")])  # what a killed bench left running
    other = subprocess.Popen([*idle, str(tmp_path / "elsewhere")])
    try:
        guard = start(pyz, "--stop-under", str(work), "--undo", json.dumps(["touch", str(work / "undone")]))
        assert first(guard) == {"armed": True}
        guard.communicate(b"", timeout=30)
        assert job.wait(10) == -signal.SIGTERM and (work / "undone").exists()
        assert other.poll() is None  # only what names the directory
    finally:
        for p in (job, other):
            p.kill()
            p.wait()
