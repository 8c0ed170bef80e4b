"""The agent's background jobs (agent/jobs.py) through the real zipapp, as the bench and the fleet's site servers
run them: a job outlives the command that started it, keeps its exit status and its window on the board's
monotonic clock, hands a file's text back when it is done, is stopped by SIGTERM (then SIGKILL for one that
ignores it, with everything in its process group), and one killed from outside is reported gone."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest


def _verb(agent_pyz: Path, *args: str) -> dict:
    res = subprocess.run([sys.executable, str(agent_pyz), *args], capture_output=True, text=True, check=False,
                         timeout=60)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout.strip().splitlines()[-1])


def _until_done(agent_pyz: Path, job: Path, collect: str = "") -> dict:
    for _ in range(100):
        got = _verb(agent_pyz, "job-wait", str(job), "20", *(["--collect", collect] if collect else []))
        if got["state"] != "running":
            return got
    raise AssertionError("the job never ended")


def test_a_job_runs_detached_and_reports_its_status_window_and_file(agent_pyz: Path, tmp_path: Path) -> None:
    job, result = tmp_path / "job", tmp_path / "result.json"
    before = time.monotonic()
    started = subprocess.run([sys.executable, str(agent_pyz), "job-start", str(job), "sh", "-c",
                              f"echo out; echo err >&2; sleep 0.3; echo '{{\"x\": 1}}' > {result}; exit 3"],
                             capture_output=True, text=True, check=False, timeout=30)
    assert started.returncode == 0, started.stderr
    assert json.loads(started.stdout)["pid"] > 0  # returned while the job still runs: its pipes are not ours
    assert _verb(agent_pyz, "job-wait", str(job), "0")["state"] == "running"
    done = _until_done(agent_pyz, job, str(result))
    assert done["state"] == "done" and done["rc"] == 3 and json.loads(done["collected"]) == {"x": 1}
    t0, t1 = done["window"]
    assert before <= t0 and t1 - t0 >= 0.3 and t1 <= time.monotonic()  # this machine's monotonic clock
    assert (job / "out").read_text() == "out\n" and (job / "err").read_text() == "err\n"
    assert _verb(agent_pyz, "job-stop", str(job), "1")["stopped"] == "ended"


def test_stop_sends_sigterm_then_kills_the_process_group(agent_pyz: Path, tmp_path: Path) -> None:
    polite, stubborn = tmp_path / "polite", tmp_path / "stubborn"
    _verb(agent_pyz, "job-start", str(polite), "sleep", "60")
    assert _verb(agent_pyz, "job-stop", str(polite), "5")["stopped"] == "stopped"
    assert _until_done(agent_pyz, polite)["rc"] == 128 + signal.SIGTERM
    # Ignores SIGTERM and has a child of its own: both die with the group.
    mark = tmp_path / "grandchild"
    got = _verb(agent_pyz, "job-start", str(stubborn), "sh", "-c", f"trap '' TERM; sleep 60 & echo $! > {mark}; wait")
    for _ in range(100):
        if mark.is_file() and mark.read_text().strip():
            break
        time.sleep(0.05)
    grandchild = int(mark.read_text())
    stopped = _verb(agent_pyz, "job-stop", str(stubborn), "0.5")
    assert stopped["stopped"] == "killed"
    for pid in (got["pid"], got["child"], grandchild):
        if pid:
            for _ in range(50):
                if not Path(f"/proc/{pid}").exists() or Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z":
                    break
                time.sleep(0.05)
            else:
                pytest.fail(f"process {pid} outlived job-stop")


def test_a_job_killed_from_outside_is_gone_not_running(agent_pyz: Path, tmp_path: Path) -> None:
    job = tmp_path / "job"
    got = _verb(agent_pyz, "job-start", str(job), "sleep", "60")
    os.killpg(got["pid"], signal.SIGKILL)  # the wrapper and the command: no exit status is written
    for _ in range(100):
        state = _verb(agent_pyz, "job-wait", str(job), "1")
        if state["state"] != "running":
            break
    assert state == {"state": "gone", "pid": got["pid"], "child": got["child"]}


def test_a_command_that_does_not_exist_ends_with_127(agent_pyz: Path, tmp_path: Path) -> None:
    job = tmp_path / "job"
    _verb(agent_pyz, "job-start", str(job), "/nonexistent/program")
    done = _until_done(agent_pyz, job)
    assert done["rc"] == 127 and "cannot run /nonexistent/program" in (job / "err").read_text()
