"""The llama.cpp engine: llama-server built for the board, GGUF models, `--spec-type draft-mtp`.

What a release holds: bin/ (the build for the board: host for an x86 sim board, the profile's CUDA
build for a Jetson, its CPU build for an emulated one), models/target.gguf and models/drafter.gguf,
the agent, and the units that start bin/llama-server with flags spelled as its own --help spells them.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from edgekit.build import BuildResult
from edgekit.build.source import LLAMA_CPP_SHORT
from edgekit.config.boardfile import Board
from edgekit.config.recipes import Recipe, Runtime
from edgekit.engines.base import EngineRelease, ReleaseContext
from edgekit.engines.capabilities import EngineBase, FleetBoard, FleetReleases
from edgekit.engines.llamacpp import compute
from edgekit.engines.llamacpp.args import server_args
from edgekit.engines.llamacpp.quirks import Applied, apply_guards
from edgekit.engines.llamacpp.settings import KV_TYPES, SECTION, SPEC_TYPES, LlamaCppSettings, changed
from edgekit.errors import EdgekitError
from edgekit.models.footprint import KvBytes, KvLayout, sum_layouts
from edgekit.paths import cache_dir
from edgekit.release.auth import auth_fields
from edgekit.release.chat_template import template_files
from edgekit.release.health import GpuPolicy
from edgekit.release.memory import kv_fields
from edgekit.release.plan import ReleasePlan, agent_files, plan_release, service_ports, service_units
from edgekit.release.units import run_as_fields
from edgekit.remote.probe import BoardFacts

if TYPE_CHECKING:
    from rich.console import Console

    from edgekit.engines.benchconf import ServerConfig


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


def llama_src(src: str | None) -> str | None:
    """The llama.cpp source to build from: given, $EDGEKIT_LLAMA_SRC, or None (the pinned git ref)."""
    return src or os.environ.get("EDGEKIT_LLAMA_SRC") or None


def server_help(built: BuildResult) -> str:
    """`llama-server --help` of the artifact, run here (under qemu for aarch64), cached by artifact key.

    A CUDA cross build finds libcudart/libcublas in the toolkit it was built with (the board has its own)."""
    key, bin_dir = built.artifact.key, built.bin_dir
    cached = cache_dir() / "help" / f"{key}.txt"
    if cached.is_file():
        return cached.read_text()
    from edgekit.build.verify import qemu_prefix

    libs = [str(bin_dir)]
    if built.plan.cuda is not None and built.plan.where == "workstation":
        libs.append(str(built.plan.cuda.lib_dir))
    argv = [*qemu_prefix(built.plan.target), str(bin_dir / "llama-server"), "--help"]
    env = {**os.environ, "LD_LIBRARY_PATH": os.pathsep.join(libs)}
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120, check=False)
    text = proc.stdout + proc.stderr
    if "--port" not in text:
        last = (text.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
        raise EdgekitError(f"`llama-server --help` of build {key[:12]} printed no usage ({last}); the build "
                           "is broken.")
    cached.parent.mkdir(parents=True, exist_ok=True)
    cached.write_text(text)
    return text


def media_kinds(models: dict[str, Path]) -> list[str]:
    """What the release's mmproj lets llama-server take besides text ("image", "audio"), from its header."""
    from edgekit.convert.gguf_io import GGUFFile

    header = GGUFFile(models["models/mmproj.gguf"])
    return [kind for kind, key in (("image", "clip.has_vision_encoder"), ("audio", "clip.has_audio_encoder"))
            if header.get(key)]


def fit_mmproj(recipe: Recipe, models: dict[str, Path], mem_total_mb: int | None,
               say: Callable[[str], None]) -> dict[str, Path]:
    """``convert.mmproj: auto`` serves the projector only where the board's memory holds it beside the text
    model (the model files twice, for weights and their working set, plus 1 GiB); else text only, said with
    the figures. ``on`` serves it anyway."""
    if "models/mmproj.gguf" not in models or recipe.convert.mmproj != "auto" or mem_total_mb is None:
        return models
    sizes = {rel: path.stat().st_size / 1e6 for rel, path in models.items()}
    need = 2 * sum(sizes.values()) + 1024
    if need <= mem_total_mb:
        return models
    say(f"the board has {mem_total_mb} MB of memory and serving the mmproj ({sizes['models/mmproj.gguf']:.0f} MB) "
        f"with the model would need about {need:.0f} MB: images and audio are not served (convert.mmproj: on "
        "serves them anyway)")
    return {rel: path for rel, path in models.items() if rel != "models/mmproj.gguf"}


def gguf_kv_layout(gguf: Path) -> KvLayout:
    """The cache llama.cpp keeps for the GGUF, from its metadata: per layer its KV heads and head size (full and
    sliding layers apart, each with its own), only the layers that own a cache (``shared_kv_layers`` at the end
    read an earlier one's; an assistant's all), sliding layers capped at the window. Without a sliding pattern
    every layer counts as full (an upper bound). Remembered per file (size, mtime) like the chat template."""
    from edgekit.build.memo import remember

    def read() -> str:
        from edgekit.convert.gguf_io import GGUFFile

        f = GGUFFile(gguf)
        arch = f.arch or ""

        def get(key: str) -> Any:
            return f.get(f"{arch}.{key}")

        layers, heads = int(get("block_count") or 0), get("attention.head_count_kv")
        if not layers or not heads:
            return json.dumps(KvLayout(0, 0, 0, 0, 0).to_dict())
        per_layer = list(heads) if isinstance(heads, (list, tuple)) else [heads] * layers
        q_heads = get("attention.head_count")
        q = max(list(q_heads) if isinstance(q_heads, (list, tuple)) else [q_heads or 1])
        k = int(get("attention.key_length") or (int(get("embedding_length") or 0) // int(q or 1)))
        v = int(get("attention.value_length") or k)
        k_swa, v_swa = int(get("attention.key_length_swa") or k), int(get("attention.value_length_swa") or v)
        pattern = list(get("attention.sliding_window_pattern") or [False] * layers)
        owning = layers - int(get("attention.shared_kv_layers") or 0)
        full_k = full_v = swa_k = swa_v = 0
        for il in range(owning):
            n = int(per_layer[il])
            if pattern[il]:
                swa_k, swa_v = swa_k + n * k_swa, swa_v + n * v_swa
            else:
                full_k, full_v = full_k + n * k, full_v + n * v
        window = int(get("attention.sliding_window") or 0) if any(pattern) else 0
        return json.dumps(KvLayout(full_k, full_v, swa_k, swa_v, window).to_dict())

    return KvLayout(**json.loads(remember("kv-layout", gguf, read)))


def gguf_context_length(gguf: Path) -> int | None:
    """The context the model was trained for (``<arch>.context_length``): llama-server gives no slot more."""
    from edgekit.build.memo import remember

    def read() -> str:
        from edgekit.convert.gguf_io import GGUFFile

        f = GGUFFile(gguf)
        return str(f.get(f"{f.arch or ''}.context_length") or 0)

    return int(remember("gguf-context-length", gguf, read)) or None


def gguf_attention_shape(gguf: Path) -> tuple[int, int]:
    """(query heads of its widest layer, vocabulary) of a GGUF: what its compute buffers scale with."""
    from edgekit.build.memo import remember

    def read() -> str:
        from edgekit.convert.gguf_io import GGUFFile

        f = GGUFFile(gguf)
        heads = f.get(f"{f.arch or ''}.attention.head_count") or 0
        heads = max(heads) if isinstance(heads, list) else heads  # per layer, where layers differ
        vocab = f.get(f"{f.arch or ''}.vocab_size") or len(f.get("tokenizer.ggml.tokens") or [])
        return f"{int(heads)} {int(vocab)}"

    heads, vocab = remember("gguf-attention-shape", gguf, read).split()
    return int(heads), int(vocab)


def kv_layout(models: Mapping[str, Path]) -> KvLayout:
    """The release's cache: the target's and the drafter's layouts together (an assistant owns none)."""
    return sum_layouts([gguf_kv_layout(path) for rel, path in models.items()
                        if rel in ("models/target.gguf", "models/drafter.gguf")])


def gguf_has_chat_template(gguf: Path) -> bool:
    """An instruction-tuned target carries its chat template: health then talks to it through it.

    Remembered per file (size, mtime): a redeploy that changes nothing must not parse the GGUF's header.
    """
    from edgekit.build.memo import remember

    def read() -> str:
        from edgekit.convert.gguf_io import GGUFFile

        return "1" if "tokenizer.chat_template" in GGUFFile(gguf).kv_raw else "0"

    return remember("gguf-chat-template", gguf, read) == "1"


def release_files(bin_dir: Path, models: dict[str, Path]) -> dict[str, Path]:
    files = {f"bin/{p.name}": p for p in sorted(bin_dir.iterdir()) if p.is_file()}
    files.update(models)
    files.update(agent_files())
    return files


def compose(recipe: Recipe, board: Board, base: str, bin_dir: Path, build_key: str, help_text: str,
            models: dict[str, Path], target: str, gpu: GpuPolicy = "none", user: str | None = None) -> ReleasePlan:
    has_drafter = "models/drafter.gguf" in models
    mmproj = "models/mmproj.gguf" if "models/mmproj.gguf" in models else None
    rt, guards = apply_guards(recipe.runtime, board.profile, LLAMA_CPP_SHORT, has_drafter)
    ports = service_ports(board.service_port, rt.port)

    auth = auth_fields(rt.auth, base)

    def args_at(port: int) -> list[str]:
        return server_args(rt, help_text, "models/target.gguf", "models/drafter.gguf" if has_drafter else None, port,
                           mmproj, auth.get("api_key_file"))

    describe = {
        "engine": "llama.cpp", "recipe": recipe.name, "server_args": args_at(ports[0]), "port": ports[0],
        "sources": recipe.sources,
        "candidate_port": ports[1],
        "drafter": has_drafter, "spec_type": rt.spec_type, "build": {"key": build_key, "target": target},
        "runtime": LlamaCpp().served_runtime(rt), "guards": [g.to_dict() for g in guards], "gpu": gpu,
        "media": media_kinds(models) if mmproj else [],
        "chat": gguf_has_chat_template(models["models/target.gguf"]), **auth, **run_as_fields(user),
        **kv_fields(kv_layout(models).in_bytes(*LlamaCpp().settings(rt).kv_type_bytes)),
        "model_context": gguf_context_length(models["models/target.gguf"]),
    }

    def render(rid: str) -> dict[str, str]:
        return service_units(base, rid, lambda rdir, port: [f"{rdir}/bin/llama-server", *args_at(port)], ports,
                             rt, key_file=auth.get("api_key_file"), user=user)

    files = {**release_files(bin_dir, models), **template_files(rt.chat_template)}
    return plan_release(recipe.name, files, describe, render)


class LlamaCpp(EngineBase):
    name = "llama.cpp"
    health_api = "llama"  # llama-server's /completion with `timings`
    model_formats = ("gguf",)
    open_without_key = ("/models", "/v1/models")  # llama-server's public endpoints (and its web UI, turned off)
    color = "#1f77b4"
    tune_p_mins = (None, 0.5, 0.8)  # llama-server's --spec-draft-p-min: its default, and two thresholds
    target_gguf = "models/target.gguf"  # llama-bench and the GGUF roofline
    settings_section, Settings = SECTION, LlamaCppSettings
    spec_types = SPEC_TYPES
    kv_cache_types = KV_TYPES
    # edgekit's llama.cpp patch 0001 (edgekit/data/llama.cpp-patches): a request's own draft length, 0 = none
    draft_off_request: ClassVar[dict[str, Any] | None] = {"speculative.n_max": 0}

    def bench_configs(self, manifest: dict[str, Any], release_dir: str, board: Board, port: int,
                      parallel: int | None, slot_ctx: int | None, options: Mapping[str, Any]) -> list[ServerConfig]:
        from edgekit.engines.llamacpp import bench as llamacpp_bench

        return llamacpp_bench.configs(manifest, port, parallel, slot_ctx)

    def tune_point(self, drafter: ServerConfig, n: int, p_min: float | None) -> ServerConfig:
        from edgekit.engines.llamacpp import bench as llamacpp_bench

        return llamacpp_bench.tune_point(drafter, n, p_min)

    def tune_kv_cache(self, cfg: ServerConfig, kind: str) -> ServerConfig:
        from edgekit.engines.llamacpp import bench as llamacpp_bench

        return llamacpp_bench.with_kv_cache(cfg, kind)

    def runtime_with_kv_cache(self, runtime: Runtime, k: str, v: str) -> Runtime:
        return changed(runtime, cache_type_k=k, cache_type_v=v)

    def target_bench_argv(self, release_dir: str, runtime: dict[str, Any], pp: int, tg: int,
                          reps: int) -> list[str]:
        from edgekit.engines.llamacpp import bench as llamacpp_bench

        return llamacpp_bench.llama_bench_argv(release_dir, runtime, pp, tg, reps)

    def target_bench_records(self, lines: list[str]) -> list[dict[str, Any]]:
        from edgekit.engines.llamacpp import bench as llamacpp_bench

        return llamacpp_bench.llama_bench_records(lines)

    def report_ref(self, doc: dict[str, Any]) -> str:
        return f"llama.cpp {(doc.get('llama_cpp') or {}).get('ref') or '?'}"

    def fleet_releases(self, recipe: Recipe, targets: Mapping[str, FleetBoard], src: str | None, cuda: str,
                       console: Console) -> FleetReleases:
        """One build per board kind, the models once, one release per (build, base, service port)."""
        return _fleet_releases(recipe, targets, src, cuda, console)

    def kv_bytes_of(self, layout: KvLayout, runtime: Runtime) -> KvBytes:
        return layout.in_bytes(*self.settings(runtime).kv_type_bytes)

    def compute_bytes_of(self, models: Sequence[tuple[int, int]], runtime: Runtime, profile: str | None,
                         ctx: int) -> int:
        """Each model's context: its logits and its attention scratch over the whole cache, with flash attention
        as the board serves it (the guards of its kind applied; ``auto``: llama.cpp turns it on)."""
        rt = apply_guards(runtime, profile, LLAMA_CPP_SHORT, len(models) > 1)[0] if profile else runtime
        flash = self.settings(rt).flash_attn != "off"
        return compute.contexts_bytes(models, ctx, flash)

    def compute_buffer_bytes(self, plan: ReleasePlan, recipe: Recipe) -> int:
        """The target's and the drafter's contexts at runtime.ctx_size, with flash attention as the release serves
        it (its guards applied: release.json's runtime)."""
        served = (plan.manifest.get("runtime") or {}).get(SECTION) or {}
        flash = served.get("flash_attn", "auto") != "off"
        return compute.contexts_bytes([gguf_attention_shape(plan.files[rel].path) for rel in (
            "models/target.gguf", "models/drafter.gguf") if rel in plan.files], recipe.runtime.ctx_size, flash)

    def kv_cache_bytes(self, plan: ReleasePlan, recipe: Recipe) -> int:
        """The cache llama-server allocates at runtime.ctx_size (its -c, shared by runtime.parallel slots) and the
        recipe's cache types (runtime.llama_cpp.cache_type_k/_v): full layers the whole context, sliding layers
        their window per slot, KV-shared layers and the assistant nothing of their own."""
        kv = kv_layout({rel: b.path for rel, b in plan.files.items()}).in_bytes(
            *self.settings(recipe.runtime).kv_type_bytes)
        return kv.at(recipe.runtime.ctx_size, recipe.runtime.parallel)

    def release(self, ctx: ReleaseContext) -> EngineRelease:
        from edgekit.build import BuildOptions, build
        from edgekit.engines.llamacpp.models import resolve_models

        stages: dict[str, float] = {}
        choice = choose_build(ctx.board, ctx.facts, ctx.cuda)
        target, src = choice.target, llama_src(ctx.src)
        if choice.note:
            ctx.say(choice.note)
        t = time.monotonic()
        ctx.say(f"build llama.cpp for {target}{' (CPU only)' if choice.cpu_only and target != 'host' else ''}")
        built = build(BuildOptions(target=target, cpu_only=choice.cpu_only, src=src, board_cuda=ctx.facts.cuda,
                                   board_jetpack=ctx.facts.jetpack), console=ctx.console, runner=ctx.runner)
        check_glibc(built.artifact.manifest, ctx.facts)
        stages["build"] = time.monotonic() - t
        t = time.monotonic()
        ctx.say("models")
        models = fit_mmproj(ctx.recipe, resolve_models(ctx.recipe, ctx.console, src), ctx.facts.mem_total_mb, ctx.say)
        stages["models"] = time.monotonic() - t
        help_text = server_help(built)
        plan = compose(ctx.recipe, ctx.board, ctx.facts.base, built.bin_dir, built.artifact.key, help_text, models,
                       target, choice.gpu, ctx.facts.service_user)
        for guard in plan.manifest["guards"]:
            ctx.say(Applied(**guard).line())
        return EngineRelease(plan, built.to_dict(), stages)


# llama.cpp's releases for a fleet: built once per build target (the boards' profile, or "host" for simulated
# boards) and JetPack line, the models converted once per recipe, and deploy's own ``compose()`` for each
# distinct (build, base directory, service port): boards that share those share one release id.
def _fleet_releases(recipe: Recipe, targets: Mapping[str, FleetBoard], src: str | None, cuda: str,
                   console: Console) -> FleetReleases:
    from edgekit.build import BuildOptions, build
    from edgekit.engines.llamacpp.models import resolve_models

    src = llama_src(src)
    result = FleetReleases()
    built: dict[str, tuple[Path, str, str]] = {}  # build target → (bin dir, key, --help)
    manifests: dict[str, dict[str, Any]] = {}
    composed: dict[tuple[str, str, int | None], ReleasePlan] = {}
    models: dict[str, Path] | None = None
    for name, t in targets.items():
        # One build per board kind and JetPack line: an Orin on JetPack 6 and one on 7.2 get different builds,
        # an emulated Orin (no GPU driver) the CPU build of its profile.
        choice = choose_build(t.board, t.facts, cuda)
        target = choice.target
        kind_key = target if target == "host" else f"{target}@{'cpu' if choice.cpu_only else t.facts.cuda}"
        if kind_key not in built:
            console.print(f"[dim]fleet: build llama.cpp for {kind_key}[/dim]")
            art = build(BuildOptions(target=target, cpu_only=choice.cpu_only, src=src, board_cuda=t.facts.cuda,
                                     board_jetpack=t.facts.jetpack), console=console, runner=t.runner)
            built[kind_key] = (art.bin_dir, art.artifact.key, server_help(art))
            result.builds[kind_key] = art.artifact.key
            manifests[kind_key] = art.artifact.manifest
        check_glibc(manifests[kind_key], t.facts)
        if models is None:
            console.print("[dim]fleet: models[/dim]")
            models = resolve_models(recipe, console, src)
        bin_dir, key, help_text = built[kind_key]
        kind = (kind_key, t.facts.base, t.board.service_port, t.facts.service_user)
        if kind not in composed:
            composed[kind] = compose(recipe, t.board, t.facts.base, bin_dir, key, help_text, models, target,
                                     choice.gpu, t.facts.service_user)
        result.plans[name] = composed[kind]
    return result
