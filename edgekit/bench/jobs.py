"""Long-running commands on the board as background jobs that outlive no one: the host's side of the agent's
job verbs (edgekit/agent/jobs.py).

A job runs in a session of its own (its own process group) with its pid, stdout, stderr and exit code in a
directory on the board. The host waits in short polls (one agent call each, at most a couple of seconds), never in
one long blocking command: a Ctrl-C on the host then reaches Python promptly, and the cleanup path stops the job by
its pid, so nothing is left running on the board.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from edgekit.errors import EdgekitError, LinkLost
from edgekit.remote import agent_call, agent_ship
from edgekit.remote.runner import LocalRunner, SshRunner

Runner = SshRunner | LocalRunner

class JobFailed(EdgekitError):
    pass


@dataclass
class Job:
    runner: Runner
    agent: str  # the agent's zipapp on the board (remote.agent_ship.ensure)
    dir: str
    what: str  # for messages: "the load", "llama-bench", ...
    pid: int | None = None
    rc: int | None = None
    collected: str = ""
    window: tuple[float, float] | None = None  # the command's run on the board's monotonic clock, once done
    gone_why: str = ""  # what the board saw of a job that ended without an exit code (its pid files)

    @classmethod
    def start(cls, runner: Runner, agent: str, job_dir: str, argv: list[str], what: str) -> Job:
        job = cls(runner, agent, job_dir, what)
        job.launch(argv)
        return job

    def _verb(self, verb: str, *args: str, timeout: float) -> dict:
        res = self.runner.run(agent_ship.argv(self.agent, verb, *args), check=False, timeout=timeout)
        got = agent_call.answer(res)
        if not res.ok or got is None:
            raise EdgekitError(f"Running {self.what} on board {self.runner.name!r} failed ({verb}): "
                               f"{agent_call.why(res)}.")
        return got

    def launch(self, argv: list[str]) -> None:
        pid = self._verb("job-start", self.dir, *argv, timeout=30).get("pid")
        self.pid = pid if isinstance(pid, int) else None

    def poll(self, seconds: float = 2.0, collect: str | None = None) -> str:
        """Wait up to ``seconds`` on the board: "done", "running" or "gone".

        With ``collect`` (a path on the board), that file's text lands in ``self.collected`` when done.
        """
        polls = max(int(seconds * 10), 1)
        try:
            got = self._verb("job-wait", self.dir, str(polls), *(["--collect", collect] if collect else []),
                             timeout=seconds + 30)
        except LinkLost:
            raise  # a dropped link is the link's failure, not the job's: the caller says so
        except EdgekitError as exc:  # the verb itself failed on the board
            self.gone_why = f"no answer: {exc.message}"
            return "gone"
        state = str(got.get("state"))
        if state == "done":
            self.rc = int(got.get("rc", 1))
            self.collected = got.get("collected") or ""
            win = got.get("window")
            self.window = (float(win[0]), float(win[1])) if isinstance(win, list) and len(win) == 2 else None
        elif state == "gone":
            self.gone_why = f"pid={got.get('pid') or 'none'} child={got.get('child') or 'none'}"
        return state

    def wait(self, timeout: float, poll_s: float = 2.0, collect: str | None = None) -> int:
        """The job's exit code; JobFailed when it vanished or ran past ``timeout`` (then it is stopped)."""
        deadline = time.monotonic() + timeout
        while True:
            state = self.poll(min(poll_s, max(deadline - time.monotonic(), 0.1)), collect)
            if state == "done":
                return self.rc if self.rc is not None else 1
            if state == "gone":
                # Once more after a moment: a wrapper that is only slow to start (a busy board) is not gone.
                time.sleep(1.0)
                state = self.poll(0.5, collect)
                if state == "done":
                    return self.rc if self.rc is not None else 1
            if state == "gone":
                raise JobFailed(f"{self.what} on board {self.runner.name!r} ended without an exit code "
                                f"({self.gone_why}): {self.tail()}")
            if time.monotonic() >= deadline:
                self.stop()
                raise JobFailed(f"{self.what} on board {self.runner.name!r} ran past {timeout:.0f} s and was "
                                "stopped.")

    def stop(self, grace_s: float = 5.0) -> str:
        """ended, stopped (by SIGTERM) or killed; "" when the board did not answer."""
        res = self.runner.run(agent_ship.argv(self.agent, "job-stop", self.dir, f"{grace_s:g}"), check=False,
                              timeout=grace_s + 30)
        got = agent_call.answer(res)
        return str(got.get("stopped", "")) if got else ""

    def read(self, name: str = "out") -> str:
        res = self.runner.run(["cat", f"{self.dir}/{name}"], check=False, timeout=60)
        return res.stdout if res.ok else ""

    def tail(self, lines: int = 5) -> str:
        res = self.runner.run(["tail", "-n", str(lines), f"{self.dir}/err"], check=False, timeout=30)
        text = " | ".join(res.stdout.strip().splitlines())
        return text or "no output"
