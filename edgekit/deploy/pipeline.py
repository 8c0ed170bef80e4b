"""`edgekit deploy` = the engine makes the release (build, models, compose) → push → activate → health."""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console

from edgekit.config.boardfile import Board
from edgekit.config.recipes import Recipe
from edgekit.config.serve_address import is_loopback
from edgekit.deploy import activate as act
from edgekit.deploy import api_key, exposure, link_retry, memory_fit
from edgekit.errors import EdgekitError
from edgekit.release.plan import ReleasePlan
from edgekit.remote import board_key, board_setup, releases
from edgekit.remote.lock import BoardLock
from edgekit.remote.probe import BoardFacts, probe
from edgekit.remote.runner import LocalRunner, SshRunner, runner_for
from edgekit.remote.transfer import PushReport
from edgekit.store import sha256_file

if TYPE_CHECKING:
    from edgekit.engines.base import EngineRelease

Runner = SshRunner | LocalRunner


@dataclass
class DeployOptions:
    src: str | None = None  # llama.cpp source for the build (dir or tarball); None → env or the pinned git ref
    strategy: str = "auto"  # auto | candidate | in-place
    wait_s: int = 0  # how long to wait for another deploy's lock
    health_timeout_s: float = 180.0
    keep: int | None = None  # releases kept on the board (default: the recipe's keep_releases)
    cuda: str = "auto"  # auto: a CUDA build when the board has a GPU driver | on | off


@dataclass
class DeployReport:
    board: str
    recipe: str
    release: str
    changed: bool
    bytes_sent: int
    blobs_sent: int
    blobs_skipped: int
    seconds: float
    health: dict[str, Any]
    build: dict[str, Any] = field(default_factory=dict)
    previous: str | None = None
    strategy: str = ""
    stages: dict[str, float] = field(default_factory=dict)
    link_retries: int = 0  # new connections after the link broke mid-push
    notes: list[str] = field(default_factory=list)  # what changed on the board besides the release
    spec_auto: dict[str, Any] | None = None  # runtime.spec auto: the A/B's decision and figures (bench.spec_auto)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    def headline(self) -> str:
        h = self.health
        tps = f"{h['tokens_per_second']:.1f} tok/s" if h.get("tokens_per_second") else "tok/s n/a"
        acc = f", acceptance {h['acceptance']:.0%} of {h['draft_n']} drafted" if h.get("draft_n") else ""
        what = "deployed" if self.changed else "already current"
        gpu = f"; GPU {h['gpu']}" if h.get("gpu") else ""
        media = "".join(f"; {kind} answered, TTFT {m['ttft_ms']:.0f} ms" for kind, m in (h.get("media") or {}).items()
                        if m.get("ok") and m.get("ttft_ms") is not None)
        return "\n".join([
            f"{self.board}: {self.release} {what} — {tps}{acc}{gpu}{media}; sent {self.bytes_sent / 1e6:.1f} MB "
            f"({self.blobs_sent} blobs, {self.blobs_skipped} already there) in {self.seconds:.1f} s", *self.notes])


def push_local(base: str, blobs: list) -> PushReport:
    """A `local` board (edgekit runs on the board itself): copy missing blobs into its store."""
    start = time.monotonic()
    store = Path(os.path.expanduser(base)) / "store"
    store.mkdir(parents=True, exist_ok=True)
    sent = skipped = sent_bytes = 0
    for blob in blobs:
        final = store / blob.sha256
        if final.is_file():
            skipped += 1
            continue
        part = store / f"{blob.sha256}.part"
        shutil.copyfile(blob.path, part)
        if sha256_file(part) != blob.sha256:
            part.unlink()
            raise EdgekitError(f"{blob.path} changed while it was copied into {store}.")
        part.chmod(0o755 if blob.executable else 0o644)
        os.replace(part, final)
        sent, sent_bytes = sent + 1, sent_bytes + blob.size
    return PushReport(sent_bytes, sent, skipped, 0, time.monotonic() - start)


def check_host(recipe: Recipe) -> None:
    """What the recipe's engine makes of its models on this workstation (converter, tiny models, a package) is
    installed: one sentence, with the command that installs it, before anything is built or sent."""
    from edgekit.engines import get_engine

    get_engine(recipe.runtime.engine).check_host_needs(recipe)


def choose_strategy(options: DeployOptions, facts: BoardFacts, plan: ReleasePlan) -> str:
    """Two servers at once only when the board's memory holds both models with room to spare."""
    if options.strategy != "auto":
        return options.strategy
    model_mb = sum(b.size for rel, b in plan.files.items() if rel.startswith("models/")) / 1e6
    if facts.mem_total_mb is None or facts.mem_total_mb > 4 * model_mb + 2048:
        return "candidate"
    return "in-place"


@dataclass
class PushOutcome:
    """`edgekit push`: a release's blobs on the board, verified, not activated."""

    board: str
    recipe: str
    release: str
    bytes_sent: int
    blobs_sent: int
    blobs_skipped: int
    seconds: float
    build: dict[str, Any] = field(default_factory=dict)
    stages: dict[str, float] = field(default_factory=dict)
    link_retries: int = 0  # new connections after the link broke mid-push

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    def headline(self) -> str:
        return (f"{self.board}: {self.release} pushed, not activated — sent {self.bytes_sent / 1e6:.1f} MB "
                f"({self.blobs_sent} blobs, {self.blobs_skipped} already there) in {self.seconds:.1f} s")


def _push_blobs(runner: Runner, facts: BoardFacts, plan: ReleasePlan, stack: contextlib.ExitStack, wait_s: int,
                say: Any, progress: Any) -> PushReport:
    """Under the board's deploy lock (entered on ``stack``, held until the caller's block ends). A release that is
    not what the board serves is about to be activated: the blobs the board already has are hashed again first
    (a copy rotted at rest is sent anew); a redeploy of the current release trusts them (it serves them now)."""
    say(f"push {plan.payload_bytes / 1e6:.1f} MB of blobs (only what the board lacks is sent)")
    base = facts.base
    if isinstance(runner, LocalRunner):
        stack.enter_context(BoardLock(runner, base, wait_s))
        return push_local(base, plan.blobs)
    recheck = plan.release_id if facts.current != plan.release_id else None
    return link_retry.push_with_retries(runner, base, plan, stack, wait_s, say, progress, recheck_for=recheck)


def _say(name: str, console: Console, on_step: Any) -> Any:
    return on_step or (lambda msg: console.print(f"[dim]{name}: {msg}[/dim]"))


@dataclass
class _Pushed:
    runner: Runner
    facts: BoardFacts
    engine: Any
    made: EngineRelease
    stages: dict[str, float]
    report: PushReport
    key: str | None  # runtime.auth: key — the board's API key


@contextlib.contextmanager
def _pushed(name: str, board: Board, recipe: Recipe, options: DeployOptions, console: Console, say: Any,
            progress: Any) -> Iterator[_Pushed]:
    """Probe → the engine makes the release → its blobs onto the board, under the board's deploy lock, which
    is still held while the caller's block runs (deploy activates there; push does nothing more)."""
    from edgekit.engines import ReleaseContext, get_engine

    engine = get_engine(recipe.runtime.engine)
    engine.check_host_needs(recipe)
    engine.check_exposure(recipe.runtime.host, is_loopback(recipe.runtime.host))
    with runner_for(board, name) as runner:
        facts = probe(runner, board.base)
        if (stale := board_setup.outdated_note(name, facts)) is not None:
            say(stale)
        if facts.service_user:  # the server runs as the login user, with that user's groups
            for note in board_setup.group_notes(facts.service_user, facts):
                say(f"note: {note}")
        memory_fit.check_recipe(runner, name, facts, board.profile, recipe, engine, say)
        key = api_key.key_for(runner, facts.base, name) if recipe.runtime.auth == "key" else None
        made = engine.release(ReleaseContext(name, board, facts, recipe, runner, console, say, options.src,
                                             options.cuda))
        memory_fit.check(runner, name, facts, made.plan, engine.kv_cache_bytes(made.plan, recipe),
                         in_place=choose_strategy(options, facts, made.plan) == "in-place",
                         compute_bytes=engine.compute_buffer_bytes(made.plan, recipe))
        stages = dict(made.stages)
        with contextlib.ExitStack() as locked:
            t = time.monotonic()
            report = _push_blobs(runner, facts, made.plan, locked, options.wait_s, say, progress)
            stages["push"] = time.monotonic() - t
            yield _Pushed(runner, facts, engine, made, stages, report, key)


def push(name: str, board: Board, recipe: Recipe, options: DeployOptions, console: Console,
         on_step: Any = None, progress: Any = None) -> PushOutcome:
    """The release's blobs into the board's store (resumable, each verified by sha256); nothing is
    activated, so what the board serves does not change."""
    start = time.monotonic()
    with _pushed(name, board, recipe, options, console, _say(name, console, on_step), progress) as done:
        releases.pin(done.runner, done.facts.base, done.made.plan.release_id, [b.sha256 for b in done.made.plan.blobs])
    return PushOutcome(
        board=name, recipe=recipe.name, release=done.made.plan.release_id, bytes_sent=done.report.sent_bytes,
        blobs_sent=done.report.sent_blobs, blobs_skipped=done.report.skipped_blobs, link_retries=done.report.retries,
        seconds=round(time.monotonic() - start, 2), build=done.made.build,
        stages={k: round(v, 2) for k, v in done.stages.items()},
    )


def deploy(name: str, board: Board, recipe: Recipe, options: DeployOptions, console: Console,
           on_step: Any = None, progress: Any = None) -> DeployReport:
    say = _say(name, console, on_step)
    start = time.monotonic()
    with _pushed(name, board, recipe, options, console, say, progress) as done:
        plan, stages, facts = done.made.plan, done.stages, done.facts
        strategy = choose_strategy(options, facts, plan)
        keyed = done.key is not None and bool(plan.typed.api_key_file)
        if keyed:  # before its server starts: it reads the key as it starts
            board_key.place(done.runner, facts.base, done.key, api_key.key_envs(plan.typed.engine))
        t = time.monotonic()
        spec = act.ActivationSpec.of_plan(plan, options.keep or recipe.keep_releases, strategy,
                                          options.health_timeout_s)
        activation = act.activate(done.runner, facts.base, spec, sudo=facts.sudo_prefix, on_step=say)
        stages["activate"] = time.monotonic() - t
        notes = exposure.after_deploy(done.runner, facts.base, activation.previous, plan.typed) \
            if activation.changed else []
        notes += [api_key.usage_note(name)] if keyed else []
        for note in notes:
            say(note)
    report = done.report
    return DeployReport(
        board=name, recipe=recipe.name, release=plan.release_id, changed=activation.changed,
        bytes_sent=report.sent_bytes, blobs_sent=report.sent_blobs, blobs_skipped=report.skipped_blobs,
        link_retries=report.retries,
        seconds=round(time.monotonic() - start, 2), health=activation.health.to_dict(),
        build=done.made.build, previous=activation.previous, strategy=activation.strategy,
        stages={k: round(v, 2) for k, v in stages.items()}, notes=notes,
    )
