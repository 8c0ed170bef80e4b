"""Long-running commands on the board as background jobs that outlive no one.

A job runs under ``setsid`` in its own process group with its pid, stdout, stderr and exit code in
a directory on the board. The host waits in short polls (one SSH command each, at most a couple of
seconds), never in one long blocking command: a Ctrl-C on the host then reaches Python promptly,
and the cleanup path stops the job by its pid, so nothing is left running on the board.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from edgekit.errors import EdgekitError
from edgekit.remote.runner import LocalRunner, SshRunner

Runner = SshRunner | LocalRunner

# "$1" job dir, then argv. The wrapper (a session leader) writes `pid`; the command's own pid goes
# to `child`, its exit code to `rc` once it ends. Prints the wrapper's pid.
_START = r"""
set -eu
dir="$1"; shift
mkdir -p "$dir"
rm -f "$dir/pid" "$dir/child" "$dir/rc" "$dir/out" "$dir/err"
wrap='echo $$ > "$0/pid.part"; mv "$0/pid.part" "$0/pid"
"$@" > "$0/out" 2> "$0/err" < /dev/null &
echo $! > "$0/child"
wait $!
echo $? > "$0/rc.part"; mv "$0/rc.part" "$0/rc"'
if command -v setsid > /dev/null 2>&1; then
  nohup setsid sh -c "$wrap" "$dir" "$@" < /dev/null > /dev/null 2>&1 &
else
  nohup sh -c "$wrap" "$dir" "$@" < /dev/null > /dev/null 2>&1 &
fi
i=0
while [ ! -s "$dir/child" ] && [ $i -lt 500 ]; do sleep 0.02; i=$((i+1)); done
cat "$dir/pid" 2>/dev/null || true
"""

# "$1" job dir, "$2" polls of 0.1 s at most, "$3" a file to print once the job ended (saves a round
# trip): `rc=N` + that file, `running` or `gone` (killed before it wrote rc).
_WAIT = r"""
dir="$1"; n="$2"; collect="${3:-}"
alive() { [ -n "$1" ] && [ -r "/proc/$1/stat" ] && [ "$(sed 's/.*) //' "/proc/$1/stat" | cut -c1)" != Z ]; }
pid="$(cat "$dir/pid" 2>/dev/null || true)"
i=0
while [ ! -f "$dir/rc" ] && alive "$pid" && [ $i -lt "$n" ]; do sleep 0.1; i=$((i+1)); done
if [ -f "$dir/rc" ]; then
  echo "rc=$(cat "$dir/rc")"
  [ -n "$collect" ] && cat "$collect" 2>/dev/null
elif alive "$pid" || alive "$(cat "$dir/child" 2>/dev/null || true)"; then echo running
else echo "gone pid=${pid:-none} child=$(cat "$dir/child" 2>/dev/null || echo none)"; fi
exit 0
"""

# "$1" job dir, "$2" seconds of grace: SIGTERM to the command (so it can finish its file), wait for
# its rc, then SIGKILL the whole process group. Nothing to do for a job that already ended.
_STOP = r"""
dir="$1"; grace="$2"
alive() { [ -n "$1" ] && [ -r "/proc/$1/stat" ] && [ "$(sed 's/.*) //' "/proc/$1/stat" | cut -c1)" != Z ]; }
[ -f "$dir/rc" ] && { echo ended; exit 0; }
pid="$(cat "$dir/pid" 2>/dev/null || true)"; child="$(cat "$dir/child" 2>/dev/null || true)"
alive "$child" && kill -TERM "$child" 2>/dev/null
i=0; limit=$(awk "BEGIN { print int($grace * 10) }")
while [ ! -f "$dir/rc" ] && alive "$pid" && [ $i -lt "$limit" ]; do sleep 0.1; i=$((i+1)); done
if alive "$pid" || alive "$child"; then
  kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null
  kill -KILL "$child" 2>/dev/null
  echo killed
else
  echo stopped
fi
"""


class JobFailed(EdgekitError):
    pass


@dataclass
class Job:
    runner: Runner
    dir: str
    what: str  # for messages: "the load", "llama-bench", ...
    pid: int | None = None
    rc: int | None = None
    collected: str = ""
    gone_why: str = ""  # what the board saw of a job that ended without an exit code (its pid files)

    @classmethod
    def start(cls, runner: Runner, job_dir: str, argv: list[str], what: str) -> Job:
        job = cls(runner, job_dir, what)
        job.launch(argv)
        return job

    def launch(self, argv: list[str]) -> None:
        out = self.runner.run(["sh", "-c", _START, "edgekit-job", self.dir, *argv], timeout=30).stdout.strip()
        self.pid = int(out) if out.isdigit() else None

    def poll(self, seconds: float = 2.0, collect: str | None = None) -> str:
        """Wait up to ``seconds`` on the board: "done", "running" or "gone".

        With ``collect`` (a path on the board), that file's text lands in ``self.collected`` when done.
        """
        polls = max(int(seconds * 10), 1)
        res = self.runner.run(["sh", "-c", _WAIT, "edgekit-wait", self.dir, str(polls), collect or ""],
                              timeout=seconds + 30)
        first, _, rest = res.stdout.partition("\n")
        first = first.strip() or "gone (no answer)"
        if first.startswith("rc="):
            self.rc = int(first[3:] or 1)
            self.collected = rest
            return "done"
        if first.startswith("gone"):
            self.gone_why = first.removeprefix("gone").strip()
            return "gone"
        return first

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
        res = self.runner.run(["sh", "-c", _STOP, "edgekit-stop", self.dir, str(grace_s)], check=False,
                              timeout=grace_s + 30)
        return res.stdout.strip()

    def read(self, name: str = "out") -> str:
        res = self.runner.run(["cat", f"{self.dir}/{name}"], check=False, timeout=60)
        return res.stdout if res.ok else ""

    def tail(self, lines: int = 5) -> str:
        res = self.runner.run(["tail", "-n", str(lines), f"{self.dir}/err"], check=False, timeout=30)
        text = " | ".join(res.stdout.strip().splitlines())
        return text or "no output"
