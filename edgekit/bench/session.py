"""A bench session on one board: everything that runs there, and putting the board back.

The session holds the board's deploy lock, pushes the agent and the prompt set into a work
directory, remembers the deployed service's state, starts the power sampler, and runs a matrix of
server configurations × load points × repetitions in round-robin order (A B A B …). Whatever
happens — an error, Ctrl-C — ``close`` stops the load, the bench server and the sampler, reads
the power samples back, restores the deployed service exactly as it was and removes the work dir.
"""

from __future__ import annotations

import contextlib
import json
import math
import secrets
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from edgekit.agent import energy
from edgekit.bench import boardfs, prompts, workloads
from edgekit.bench.benchunit import BENCH_UNIT, ServiceState
from edgekit.bench.benchunit import Board as BenchBoard
from edgekit.bench.jobs import Job, JobFailed
from edgekit.bench.power import PowerLog, Sampler, TotalRail, total_rail
from edgekit.bench.workloads import Point
from edgekit.config.boardfile import Board
from edgekit.config.profiles import get_profile
from edgekit.config.recipes import Recipe
from edgekit.engines.benchconf import ServerConfig
from edgekit.errors import EdgekitError
from edgekit.release.manifest import ReleaseManifest
from edgekit.remote import agent_ship, releases
from edgekit.remote.channel_guard import ChannelGuard, guard_args
from edgekit.remote.lock import BoardLock
from edgekit.remote.probe import BoardFacts, probe
from edgekit.remote.runner import LocalRunner, SshRunner, runner_for

Runner = SshRunner | LocalRunner
PYTHON = "python3"  # the board's own interpreter (JetPack's), as for the agent


class Interrupted(EdgekitError):
    """Ctrl-C: exit 130 like any interrupted command, once the board was put back."""

    exit_code = 130


@dataclass
class SessionOptions:
    power: bool = True
    hz: float = 20.0
    total_rail: str | None = None  # override: a rail name or "sum"
    exclusive: bool = True  # stop the deployed service while measuring (board power is board-wide)
    cooldown_temp_c: float | None = None
    cooldown_timeout_s: float = 600.0
    server_timeout_s: float = 180.0
    run_timeout_s: float = 1800.0
    lock_wait_s: int = 0
    keep_board_files: bool = False
    raw_prompts: bool = False  # prompts as written, not through the model's chat template
    # A run's window must hold this many power samples (at ``hz``): a shorter one is run again, longer. J/token
    # from two or three samples is noise (a tiny model on a fast CPU finishes a run in 0.1 s).
    min_window_samples: int = 20


@dataclass(frozen=True)
class BoardRelease:
    """A release on the board, as the bench runs it."""

    engine: str
    id: str
    dir: str
    manifest: dict[str, Any]


@dataclass
class Run:
    """One measured run of the load."""

    index: int
    config: str
    point: Point
    repetition: int
    output: dict[str, Any]
    metrics: dict[str, Any]
    cooldown: dict[str, Any] | None
    server_ready_s: float | None
    power: dict[str, Any] | None = None
    lengthened: dict[str, Any] | None = None  # run again with more requests: its first window was too short

    @property
    def window(self) -> tuple[float, float]:
        w = self.output["window"]
        return float(w["start"]), float(w["end"])

    def to_json(self) -> dict[str, Any]:
        t0, t1 = self.window
        return {"index": self.index, "config": self.config, "concurrency": self.point.concurrency,
                "context_length": self.point.context_length, "temperature": self.point.temperature,
                "repetition": self.repetition,
                "window": {"start": t0, "end": t1, "duration_s": round(t1 - t0, 6)},
                "cooldown": self.cooldown, "server_ready_s": self.server_ready_s, **self.metrics,
                "power": self.power, "chat_template": self.output.get("chat_template"),
                "raw_prompts": bool(self.output.get("raw_prompts")), "lengthened": self.lengthened,
                "requests_detail": self.output.get("requests", [])}


@dataclass
class Phase:
    name: str
    start: float
    end: float
    config: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "start": round(self.start, 6), "end": round(self.end, 6), "config": self.config}


@contextlib.contextmanager
def deferred_sigint() -> Iterator[list[int]]:
    """While the board is being put back, a second Ctrl-C must not cut that short."""
    if threading.current_thread() is not threading.main_thread():
        yield []
        return
    got: list[int] = []
    old = signal.signal(signal.SIGINT, lambda signum, _frame: got.append(signum))
    try:
        yield got
    finally:
        signal.signal(signal.SIGINT, old)


class Session:
    """Use as a context manager: ``with Session(...) as sess: ...`` — closing puts the board back."""

    def __init__(self, name: str, board: Board, recipe: Recipe, opts: SessionOptions,
                 say: Callable[[str], None] = print) -> None:
        self.name, self.board, self.recipe, self.opts, self.say = name, board, recipe, opts, say
        self._runner: Runner | None = None
        self.facts: BoardFacts | None = None
        self.release = ""
        self.release_dir = ""
        self.manifest: dict[str, Any] = {}
        self.work = ""  # the work dir on the board, once made
        self.agent = ""
        self.prompts = ""
        self.bench_port = 0
        self.svc: BenchBoard | None = None
        self.phases: list[Phase] = []
        self.media_runs: list[dict[str, Any]] = []  # image/audio probes of configurations with an mmproj
        self.power_log: PowerLog | None = None
        self.rail: TotalRail | None = None
        self.service_before: ServiceState | None = None
        self.service_after: ServiceState | None = None
        self.snapshots: dict[str, Any] = {}
        self.cleanup_errors: list[str] = []
        self._jobs: list[Job] = []
        self.runs_done = 0
        self._sampler: Sampler | None = None
        self.sampling = False  # the sampler records power: short windows are lengthened (_run)
        self.power_text = ""  # the sampler's raw file, read back at the end
        self._stack = contextlib.ExitStack()

    # ---------------------------------------------------------------------------------- open

    def open(self) -> Session:
        runner = self._runner = runner_for(self.board, self.name)
        self._stack.callback(runner.close)
        self.facts = probe(runner, self.board.base)
        base = self.facts.base
        lay = releases.layout(runner, base)
        if not lay.current:
            raise EdgekitError(f"Board {self.name!r} has no deployed release; run `edgekit deploy` first.")
        self.release = lay.current
        self.manifest = releases.read_manifest(runner, base, lay.current)
        if self.manifest.get("recipe") != self.recipe.name:
            raise EdgekitError(f"Board {self.name!r} serves recipe {self.manifest.get('recipe')!r}, not "
                               f"{self.recipe.name!r}; deploy {self.recipe.name} first or bench that recipe.")
        self.engine = ReleaseManifest.of(self.manifest).engine
        self._stack.enter_context(BoardLock(runner, base, self.opts.lock_wait_s))  # no deploy meanwhile
        self.release_dir = f"{base}/releases/{self.release}"
        self.work = f"{base}/bench/{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"
        boardfs.mkdirs(runner, f"{self.work}/jobs")
        # This edgekit's agent, not the release's copy: the host parses what it writes, and a release deployed by
        # an older edgekit may lack a verb. Sent once per version (remote.agent_ship).
        self.agent = agent_ship.ensure(runner, base)
        self.prompts = f"{self.work}/prompts.json"
        boardfs.put_text(runner, self.prompts, json.dumps(prompts.load(self.recipe.bench.prompt_set)))
        self.svc = BenchBoard(runner, base, self.release_dir, self.facts.sudo_prefix, self.work,
                              int(self.manifest.get("port") or self.recipe.runtime.port), self.facts.service_user,
                              self.recipe.runtime.hardening)
        self.service_before = self.svc.remember()
        self.bench_port = int(self.manifest.get("candidate_port") or self.svc.main_port + 1)
        self.snapshots["before"] = self.agent_json(["snapshot"])
        return self

    @property
    def runner(self) -> Runner:
        if self._runner is None:
            raise RuntimeError("the session is not open")
        return self._runner

    @property
    def release_args(self) -> list[str]:
        return list(self.manifest.get("server_args") or [])

    def release_for(self, engine: str) -> BoardRelease:
        """The deployed release when it is ``engine``'s, else the board's newest release of that engine."""
        if self.engine == engine:
            return BoardRelease(engine, self.release, self.release_dir, self.manifest)
        base = self.facts.base if self.facts else self.board.base
        for rid in reversed(releases.layout(self.runner, base).releases):
            manifest = releases.read_manifest(self.runner, base, rid)
            if _engine_of(manifest) == engine:
                return BoardRelease(engine, rid, f"{base}/releases/{rid}", manifest)
        raise EdgekitError(f"Board {self.name!r} has no {engine} release to bench; deploy a recipe with "
                           f"`runtime.engine: {engine}` there first (the newest one of each engine is measured).")

    def agent_json(self, args: list[str], timeout: float = 60) -> dict[str, Any] | None:
        res = self.runner.run([PYTHON, self.agent, *args], check=False, timeout=timeout)
        try:
            return json.loads(res.stdout) if res.stdout.strip() else None
        except ValueError:
            return None

    # ---------------------------------------------------------------------------------- power

    def start_power(self) -> bool:
        """Start the sampler; False (and why, in the log) when the board has no power source."""
        profile = get_profile(self.board.profile)
        self.rail = total_rail(profile, self.opts.total_rail)
        if not self.opts.power:
            return False
        self._sampler = Sampler(self.runner, PYTHON, self.agent, self.work, self.opts.hz, self.rail)
        self._sampler.start()
        meta = self._sampler.first_line()
        if not meta or meta.get("power") == "unavailable":
            reasons = (meta or {}).get("reasons") or {}
            self.say("power unavailable: " + ("; ".join(f"{k}: {v}" for k, v in reasons.items()) or "no samples"))
            return False
        self.say(f"power: {meta.get('source')} at {self.opts.hz:g} Hz, total = {self.rail.method}")
        self.sampling = True
        return True

    def idle(self, seconds: float) -> tuple[float, float]:
        """An idle window: nothing of ours runs on the board but one sleeping process (its window is the job's)."""
        job = self._job("idle", ["sleep", f"{seconds:g}"], "the idle window")
        job.wait(seconds + 60, poll_s=min(seconds + 1, 5.0))
        if job.window is None:
            raise JobFailed(f"the idle window on board {self.name!r} has no times: {job.tail()}")
        t0, t1 = job.window
        self.phases.append(Phase("idle", t0, t1))
        return t0, t1

    def take_board(self) -> None:
        """Stop the deployed service while measuring: board power is board-wide (unless shared)."""
        if self.svc and self.service_before and self.service_before.active and self.opts.exclusive:
            self.say("stopping the deployed service while measuring (it is started again at the end)")
            # Started again by the board itself if this bench dies (SIGKILL, a cut link): the agent's guard, for as
            # long as our channel lives, then stops this bench's jobs and its unit and starts the service; on a
            # normal end the session has done all that first (the guard's steps are then no-ops).
            sudo = self.facts.sudo_prefix
            undo = [[*sudo, "systemctl", "stop", BENCH_UNIT], [*sudo, "systemctl", "start", self.svc.unit]]
            if not self.opts.keep_board_files:  # the work dir goes too, as a normal end removes it
                undo.append(["rm", "-rf", "--", self.work])
            self._stack.enter_context(ChannelGuard(self.runner, self.facts.base,
                                                   guard_args(stop_under=self.work, undo=undo)))
            self.svc.stop_main()

    # ---------------------------------------------------------------------------------- jobs

    def _job(self, name: str, argv: list[str], what: str) -> Job:
        job = Job(self.runner, self.agent, f"{self.work}/jobs/{name}", what)
        self._jobs.append(job)  # tracked before it starts: a failed start is still stopped at the end
        job.launch(argv)
        return job

    def cooldown(self) -> dict[str, Any] | None:
        below = self.opts.cooldown_temp_c
        if below is None:
            return None
        job = self._job(f"cool-{len(self._jobs)}", [PYTHON, self.agent, "wait-cool", "--below", str(below),
                                                     "--timeout", str(self.opts.cooldown_timeout_s)], "wait-cool")
        job.wait(self.opts.cooldown_timeout_s + 60)
        try:
            res = json.loads(job.read())
        except ValueError:
            return {"cooled": None, "reason": "wait-cool printed nothing"}
        if res.get("cooled") is False:
            self.say(f"warning: still {res.get('temp_c')} °C after {self.opts.cooldown_timeout_s:.0f} s of cool-down")
        return res

    def llama_bench(self, pp: int, tg: int, reps: int, release: BoardRelease) -> list[dict[str, Any]]:
        """pp / tg of the release's target alone (its engine's ``target_bench_argv``: llama.cpp's llama-bench),
        with the settings that release serves with."""
        from edgekit.engines import get_engine

        engine = get_engine(release.engine)
        rdir, rt = release.dir, release.manifest.get("runtime") or {}
        out = []
        for test, (p, n) in (("pp", (pp, 0)), ("tg", (0, tg))):
            self.cooldown()
            job = self._job(f"llama-bench-{test}", engine.target_bench_argv(rdir, rt, p, n, reps), "llama-bench")
            rc = job.wait(self.opts.run_timeout_s)
            t0, t1 = job.window or (None, None)
            lines = job.read().splitlines()
            recs = engine.target_bench_records(lines)
            if rc != 0 or not recs:
                self.say(f"warning: llama-bench {test} failed (exit {rc}): {job.tail()}")
                out.append({"test": test, "error": job.tail(), "exit_code": rc})
                continue
            for rec in recs:
                out.append({**rec, "window": {"start": t0, "end": t1}})
            if t0 is not None and t1 is not None:
                self.phases.append(Phase(f"llama-bench {test}", t0, t1))
            self.say(f"llama-bench {test}{p or n}: {recs[0].get('avg_ts') or 0:.1f} tok/s")
        return out

    # ---------------------------------------------------------------------------------- the matrix

    def run_matrix(self, matrix: list[tuple[ServerConfig, list[Point]]], reps: int, n_gen: int,
                   warmup: int, requests: Callable[[Point], int], ignore_eos: bool,
                   on_run: Callable[[Run, int], None] | None = None, first_rep: int = 0) -> list[Run]:
        """Each repetition: every configuration in turn (A B A B …), each of its points on one warm server.

        The same repetition number gives the same prompts to every configuration (a fair pair); ``first_rep``
        continues an earlier call's numbering (more pairs on other prompts).
        """
        runs: list[Run] = []
        total = reps * sum(len(points) for _, points in matrix)
        for rep in range(first_rep, first_rep + reps):
            for cfg, points in matrix:
                ready: float | None = self.svc.start_server(cfg.args, self.bench_port, f"edgekit bench: {cfg.name}",
                                                            self.opts.server_timeout_s, cfg.exe, cfg.env,
                                                            cfg.release_dir, cfg.env_file, cfg.key_file)
                self.say(f"server {cfg.name} ready in {ready:.1f} s (repetition {rep + 1}/{first_rep + reps})")
                for point in points:
                    runs.append(self._run(self.runs_done, cfg, point, rep, n_gen, warmup, requests(point), ignore_eos,
                                          ready))
                    ready = None  # only the first run after a start carries the server's start-up time
                    self.runs_done += 1  # the run's index: its jobs' names on the board, across calls
                    if on_run:
                        on_run(runs[-1], total)
                self._probe_media(cfg, rep, n_gen)
                self.svc.stop_server()
        return runs

    def _probe_media(self, cfg: ServerConfig, rep: int, n_gen: int) -> None:
        """A warm server with an mmproj: one image and one second of audio, each through /v1/chat/completions."""
        from edgekit.config.api_keys import read_key
        from edgekit.deploy.health import media_completion

        key = read_key(self.name) if cfg.key_file else None
        for kind in cfg.media:
            out = media_completion(self.runner, self.bench_port, kind, n_gen, self.opts.run_timeout_s, key)
            self.media_runs.append({"config": cfg.name, "rep": rep, "kind": kind, **out})
            if not out["ok"]:
                self.say(f"warning: {cfg.name}: {out['reason']}")

    def _run(self, k: int, cfg: ServerConfig, point: Point, rep: int, n_gen: int, warmup: int,
             n_requests: int, ignore_eos: bool, ready: float | None) -> Run:
        """One run of the load; a window too short to hold ``opts.min_window_samples`` power samples is run again
        with proportionally more requests (the same prompts, cycled), and the run says so (``lengthened``)."""
        cool = self.cooldown()
        label = f"{cfg.name} {point.label()} rep {rep + 1}"
        output = self._load(k, cfg, point, rep, n_gen, warmup, n_requests, ignore_eos, label)
        lengthened = None
        for again in range(1, 4):  # a window still short after three tries keeps its count (the report shows it)
            start, end = float(output["window"]["start"]), float(output["window"]["end"])
            expected = (end - start) * self.opts.hz
            if not self.sampling or expected >= self.opts.min_window_samples:
                break
            more = min(64, math.ceil(1.25 * self.opts.min_window_samples / max(expected, 0.5)))
            lengthened = {"requests_before": lengthened["requests_before"] if lengthened else n_requests,
                          "window_s_before": lengthened["window_s_before"] if lengthened else round(end - start, 3),
                          "requests": n_requests * more}
            self.say(f"{label}: {end - start:.2f} s holds ≈ {expected:.0f} power samples, fewer than "
                     f"{self.opts.min_window_samples}: again with {n_requests * more} requests")
            n_requests *= more
            output = self._load(k, cfg, point, rep, n_gen, 0, n_requests, ignore_eos, label, again)
        run = Run(k, cfg.name, point, rep, output, workloads.load_metrics(output), cool,
                  round(ready, 3) if ready is not None else None, lengthened=lengthened)
        t0, t1 = run.window
        self.phases.append(Phase(f"run {k}", t0, t1, cfg.name))
        if run.metrics["errors"]:
            self.say(f"warning: {run.metrics['errors']} of {run.metrics['requests']} requests failed in {label}")
        return run

    def _load(self, k: int, cfg: ServerConfig, point: Point, rep: int, n_gen: int, warmup: int, n_requests: int,
              ignore_eos: bool, label: str, again: int = 0) -> dict[str, Any]:
        """The agent's load against the bench server: its output (requests, window, counters)."""
        name = f"load-{k}" + (f"-again{again}" if again else "")  # a lengthened run's load is a job of its own
        out_file = f"{self.work}/{name}.json"
        argv = workloads.load_argv(PYTHON, self.agent, self.bench_port, self.prompts, point, n_requests, n_gen,
                                   warmup, rep, ignore_eos, out_file, label, cfg.api, cfg.model,
                                   self.opts.raw_prompts, cfg.key_file, cfg.draft_counters)
        job = self._job(name, argv, "the load")
        rc = job.wait(self.opts.run_timeout_s, collect=out_file)
        raw = job.collected.strip()
        if rc != 0 or not raw:
            died = self.svc.stopped() if self.svc is not None else None
            if died is not None:  # the load only saw a refused connection: systemd and the server's log say why
                raise EdgekitError(f"The bench server ({cfg.name}) stopped during the load ({label}) on board "
                                   f"{self.name!r}: {died}")
            raise EdgekitError(f"The load ({label}) failed on board {self.name!r} (exit {rc}): {job.tail()}")
        return json.loads(raw)

    # ---------------------------------------------------------------------------------- close

    def close(self) -> None:
        """Stop everything we started, read the power back, restore the service, remove the work dir."""
        with deferred_sigint():
            if self._runner is None:  # never connected: nothing on the board to undo
                self._stack.close()
                return
            for step in (self._stop_jobs, self._stop_server, self._stop_sampler, self._read_power,
                         self._snapshot_after, self._restore, self._remove_work):
                try:
                    step()
                except Exception as exc:  # every step must get its chance
                    self.cleanup_errors.append(f"{step.__name__.strip('_')}: {exc}")
            self._stack.close()

    def _stop_jobs(self) -> None:
        for job in self._jobs:
            if job.rc is None:  # still running, or we never saw it end
                job.stop(grace_s=3.0)

    def _stop_server(self) -> None:
        if self.svc is not None:
            self.svc.stop_server()

    def _stop_sampler(self) -> None:
        if self._sampler is not None:
            self._sampler.stop()

    def _read_power(self) -> None:
        if self._sampler is None:
            return
        self.power_text = boardfs.read_text(self.runner, self._sampler.path) or ""
        with tempfile.TemporaryDirectory(prefix="edgekit-bench-") as tmp:
            local = Path(tmp) / "power.jsonl"
            local.write_text(self.power_text)
            meta, samples, end = energy.read_samples(str(local))
        self.power_log = PowerLog(meta, samples, end)

    def _snapshot_after(self) -> None:
        if self.work:
            self.snapshots["after"] = self.agent_json(["snapshot"])

    def _restore(self) -> None:
        if self.svc is not None:
            self.service_after = self.svc.restore(self.opts.server_timeout_s)

    def _remove_work(self) -> None:
        if self.work and not self.opts.keep_board_files:
            boardfs.remove_tree(self.runner, self.work)

    def __enter__(self) -> Session:
        try:
            return self.open()
        except BaseException:
            self.close()
            raise

    def __exit__(self, exc_type: type[BaseException] | None, *_exc: object) -> None:
        self.close()
        if exc_type is KeyboardInterrupt:
            raise Interrupted(self._interrupted()) from None

    def _interrupted(self) -> str:
        before, after = self.service_before, self.service_after
        if before is not None and after is not None and (before.active, before.unit_sha256) == (
                after.active, after.unit_sha256):
            state = f"{'running' if after.active else 'stopped'}, release {self.release}"
            return f"Interrupted: the load was stopped and board {self.name!r}'s service is as it was ({state})."
        return (f"Interrupted: the load was stopped, but board {self.name!r}'s service may not be as it was: "
                + ("; ".join(self.cleanup_errors) or "its state could not be read") + ".")


def check_restored(session: Session) -> None:
    """An EdgekitError when the deployed service did not end up as it was."""
    before, after = session.service_before, session.service_after
    if before is None:
        return
    if after is None or (after.active, after.unit_sha256) != (before.active, before.unit_sha256):
        raise EdgekitError(f"The deployed service on board {session.name!r} is not as it was "
                           f"(before {before.to_json()}, after {after.to_json() if after else 'unknown'}): "
                           + "; ".join(session.cleanup_errors))


__all__ = ["BoardRelease", "Interrupted", "JobFailed", "Run", "Session", "SessionOptions", "check_restored"]


def _engine_of(manifest: dict[str, Any]) -> str | None:
    """A release's engine; None for one whose release.json is missing or damaged (bench passes it by)."""
    try:
        return ReleaseManifest.of(manifest).engine
    except ValidationError:
        return None
