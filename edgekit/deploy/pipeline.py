"""`edgekit deploy` = build (for the board) → models → push → activate → health → one line of figures."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from edgekit.build.source import LLAMA_CPP_SHORT
from edgekit.config.boardfile import Board
from edgekit.config.recipes import Recipe
from edgekit.deploy import activate as act
from edgekit.deploy.compose import ReleasePlan, plan_release
from edgekit.deploy.health import GpuPolicy
from edgekit.deploy.quirks import Applied, apply_guards
from edgekit.deploy.server_args import server_args
from edgekit.deploy.unit import UNIT_NAME, render_unit
from edgekit.errors import EdgekitError
from edgekit.paths import cache_dir
from edgekit.remote.lock import BoardLock
from edgekit.remote.probe import BoardFacts, probe
from edgekit.remote.runner import LocalRunner, SshRunner, runner_for
from edgekit.remote.transfer import PushReport
from edgekit.store import sha256_file

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

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    def headline(self) -> str:
        h = self.health
        tps = f"{h['tokens_per_second']:.1f} tok/s" if h.get("tokens_per_second") else "tok/s n/a"
        acc = f", acceptance {h['acceptance']:.0%} of {h['draft_n']} drafted" if h.get("draft_n") else ""
        what = "deployed" if self.changed else "already current"
        gpu = f"; GPU {h['gpu']}" if h.get("gpu") else ""
        return (f"{self.board}: {self.release} {what} — {tps}{acc}{gpu}; sent {self.bytes_sent / 1e6:.1f} MB "
                f"({self.blobs_sent} blobs, {self.blobs_skipped} already there) in {self.seconds:.1f} s")


def build_target(board: Board, facts: BoardFacts) -> str:
    """A simulated board (or any x86 host) runs the host build; a Jetson its profile's build."""
    if facts.arch in ("x86_64", "amd64"):
        return "host"
    if facts.arch != "aarch64":
        raise EdgekitError(f"Board architecture {facts.arch!r} is not one edgekit builds for.")
    return board.profile


@dataclass
class BuildChoice:
    target: str  # host | a board profile
    cpu_only: bool
    gpu: GpuPolicy  # what the health check demands of the GPU
    note: str | None = None  # said when the choice is not the obvious one


def choose_build(board: Board, facts: BoardFacts, cuda: str) -> BuildChoice:
    """Which build the board runs: a simulated x86 board the host build; a Jetson its profile's CUDA
    build; an aarch64 board without a GPU driver (an emulated one) the CPU build of its profile,
    unless ``cuda`` is "on" (then the exact bytes a Jetson gets, which fall back to the CPU there)."""
    target = build_target(board, facts)
    if target == "host" or cuda == "off":
        return BuildChoice(target, True, "none")
    if facts.gpu_driver:
        return BuildChoice(target, False, "required")
    if cuda == "on":
        return BuildChoice(target, False, "optional", "the board has no GPU driver: the CUDA build will run on "
                                                      "its CPU (on a Jetson that is a failed deploy)")
    return BuildChoice(target, True, "none", f"the board has no GPU driver (an emulated {facts.arch} board?): "
                                             f"the CPU-only {target} build (--cuda on for the CUDA one)")


def check_glibc(built_manifest: dict[str, Any], facts: BoardFacts) -> None:
    """The board's own glibc, as probed, against what the shipped binaries ask for."""
    needed = (built_manifest.get("verify") or {}).get("glibc_needed")
    if not needed or not facts.glibc:
        return
    if tuple(map(int, needed.split("."))) > tuple(map(int, facts.glibc.split("."))):
        raise EdgekitError(f"The {facts.arch} binaries need GLIBC {needed}, but board {facts.board!r} has glibc "
                           f"{facts.glibc}; nothing was sent (build them against an older sysroot).")


def llama_src(options: DeployOptions) -> str | None:
    return options.src or os.environ.get("EDGEKIT_LLAMA_SRC") or None


def server_help(bin_dir: Path, target: str, key: str) -> str:
    """`llama-server --help` of the artifact, run here (under qemu for aarch64), cached by artifact key."""
    cached = cache_dir() / "help" / f"{key}.txt"
    if cached.is_file():
        return cached.read_text()
    from edgekit.build.targets import resolve_target
    from edgekit.build.verify import qemu_prefix

    argv = [*qemu_prefix(resolve_target(target)), str(bin_dir / "llama-server"), "--help"]
    env = {**os.environ, "LD_LIBRARY_PATH": str(bin_dir)}
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120, check=False)
    text = proc.stdout + proc.stderr
    if "--port" not in text:
        raise EdgekitError(f"`llama-server --help` of build {key[:12]} printed no usage; the build is broken.")
    cached.parent.mkdir(parents=True, exist_ok=True)
    cached.write_text(text)
    return text


def release_files(bin_dir: Path, models: dict[str, Path]) -> dict[str, Path]:
    files = {f"bin/{p.name}": p for p in sorted(bin_dir.iterdir()) if p.is_file()}
    files.update(models)
    agent = Path(__file__).resolve().parents[1] / "agent"
    if agent.is_dir():  # the board-side agent travels with every release (stdlib only)
        files.update({f"agent/{p.name}": p for p in sorted(agent.glob("*.py"))})
    return files


def compose(recipe: Recipe, board: Board, base: str, bin_dir: Path, build_key: str, help_text: str,
            models: dict[str, Path], target: str, gpu: GpuPolicy = "none") -> ReleasePlan:
    has_drafter = "models/drafter.gguf" in models
    rt, guards = apply_guards(recipe.runtime, board.profile, LLAMA_CPP_SHORT, has_drafter)
    port = board.service_port or rt.port
    candidate_port = port + 1 if port < 65535 else port - 1
    args = server_args(rt, help_text, "models/target.gguf", "models/drafter.gguf" if has_drafter else None, port)
    cand_args = server_args(rt, help_text, "models/target.gguf",
                            "models/drafter.gguf" if has_drafter else None, candidate_port)
    describe = {
        "recipe": recipe.name, "server_args": args, "port": port, "candidate_port": candidate_port,
        "drafter": has_drafter, "spec_type": rt.spec_type, "build": {"key": build_key, "target": target},
        "runtime": rt.model_dump(mode="json"), "guards": [g.to_dict() for g in guards], "gpu": gpu,
    }

    def render(rid: str) -> dict[str, str]:
        rdir = f"{base}/releases/{rid}"
        server = f"{rdir}/bin/llama-server"
        return {
            UNIT_NAME: render_unit(rdir, [server, *args], f"{base}/logs/llama-server.log",
                                   f"edgekit llama-server ({recipe.name}, release {rid})", environment=rt.env),
            act.CANDIDATE_UNIT: render_unit(rdir, [server, *cand_args], f"{base}/logs/llama-server-candidate.log",
                                            f"edgekit candidate llama-server ({recipe.name}, release {rid})",
                                            environment=rt.env),
        }

    return plan_release(recipe.name, release_files(bin_dir, models), describe, render)


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


def choose_strategy(options: DeployOptions, facts: BoardFacts, plan: ReleasePlan) -> str:
    """Two servers at once only when the board's memory holds both models with room to spare."""
    if options.strategy != "auto":
        return options.strategy
    model_mb = sum(b.size for rel, b in plan.files.items() if rel.startswith("models/")) / 1e6
    if facts.mem_total_mb is None or facts.mem_total_mb > 4 * model_mb + 2048:
        return "candidate"
    return "in-place"


def deploy(name: str, board: Board, recipe: Recipe, options: DeployOptions, console: Console,
           on_step: Any = None, progress: Any = None) -> DeployReport:
    from edgekit.deploy.models import resolve_models
    from edgekit.remote.transfer import push_blobs

    say = on_step or (lambda msg: console.print(f"[dim]{name}: {msg}[/dim]"))
    start = time.monotonic()
    stages: dict[str, float] = {}
    with runner_for(board, name) as runner:
        facts = probe(runner, board.base)
        base = facts.base
        choice = choose_build(board, facts, options.cuda)
        target = choice.target
        t = time.monotonic()
        from edgekit.build import BuildOptions, build

        if choice.note:
            say(choice.note)
        say(f"build llama.cpp for {target}{' (CPU only)' if choice.cpu_only and target != 'host' else ''}")
        built = build(BuildOptions(target=target, cpu_only=choice.cpu_only, src=llama_src(options),
                                   board_cuda=facts.cuda, board_jetpack=facts.jetpack),
                      console=console, runner=runner)
        check_glibc(built.artifact.manifest, facts)
        bin_dir = built.bin_dir
        stages["build"] = time.monotonic() - t
        t = time.monotonic()
        say("models")
        models = resolve_models(recipe, console, llama_src(options))
        stages["models"] = time.monotonic() - t
        help_text = server_help(bin_dir, target, built.artifact.key)
        plan = compose(recipe, board, base, bin_dir, built.artifact.key, help_text, models, target, choice.gpu)
        for guard in plan.manifest["guards"]:
            say(Applied(**guard).line())
        strategy = choose_strategy(options, facts, plan)
        with BoardLock(runner, base, options.wait_s):
            t = time.monotonic()
            say(f"push {plan.payload_bytes / 1e6:.1f} MB of blobs (only what the board lacks is sent)")
            if isinstance(runner, LocalRunner):
                report = push_local(base, plan.blobs)
            else:
                report = push_blobs(runner, base, plan.blobs, progress=progress)
            stages["push"] = time.monotonic() - t
            t = time.monotonic()
            activation = act.activate(
                runner, base, plan.release_id, plan.file_shas(), port=plan.manifest["port"],
                candidate_port=plan.manifest["candidate_port"], expect_drafts=plan.manifest["drafter"],
                need_sudo=facts.sudo != "root", keep=options.keep or recipe.keep_releases,
                strategy=strategy, timeout=options.health_timeout_s, on_step=say, gpu=choice.gpu,
            )
            stages["activate"] = time.monotonic() - t
    return DeployReport(
        board=name, recipe=recipe.name, release=plan.release_id, changed=activation.changed,
        bytes_sent=report.sent_bytes, blobs_sent=report.sent_blobs, blobs_skipped=report.skipped_blobs,
        seconds=round(time.monotonic() - start, 2), health=activation.health.to_dict(),
        build=built.to_dict(), previous=activation.previous, strategy=strategy,
        stages={k: round(v, 2) for k, v in stages.items()},
    )
