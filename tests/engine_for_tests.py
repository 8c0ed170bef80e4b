"""A fourth serving engine, defined here and nowhere else, registered with one line in the environment:

    EDGEKIT_ENGINES="plain=engine_for_tests:Plain"   (this directory on PYTHONPATH)

``plain`` serves the recipe's target alone (no drafter) with llama-server from the host build edgekit makes for
simulated boards (``host_build_for_tests``), with argv of its own (long flags, no speculative ones) and a
release layout of its own (``bin/llama-server``, its libraries under ``lib/``, ``models/model.gguf``), composed
with ``edgekit.release.plan`` like the built-in engines' releases. It is built on ``EngineBase`` from scratch
(no built-in engine's class or helpers): what deploy, status, rollback, bench and fleet need of an engine is
what this module declares. Simulated (x86_64) boards only.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from edgekit.config.boardfile import Board
from edgekit.config.recipes import Recipe
from edgekit.engines import EngineBase, EngineRelease, ReleaseContext
from edgekit.engines.benchconf import ServerConfig
from edgekit.engines.capabilities import EngineOption
from edgekit.errors import EdgekitError
from edgekit.release.auth import auth_fields
from edgekit.release.plan import agent_files, plan_release, service_ports, service_units
from edgekit.store import Store

if TYPE_CHECKING:
    from edgekit.prepare.pipeline import ConvertJob

NAME = "plain"
FORMAT = "plain-q8"  # its own artifact format: the target's GGUF at Q8_0, made by its own converter step
MODEL = "models/model.gguf"
SERVER = "bin/llama-server"


class PlainSettings(BaseModel):
    """Its own section of a recipe, ``runtime.plain:`` (validated by this engine, as the recipe is loaded)."""

    model_config = ConfigDict(extra="forbid")

    threads: int = Field(1, ge=1, le=64)  # llama-server's --threads
    batch_size: int = Field(512, ge=32, le=8192)  # llama-server's --batch-size (the logical batch)


def server_argv(runtime: dict[str, Any], port: int, parallel: int | None = None, ctx: int | None = None,
                batch_size: int | None = None) -> list[str]:
    """llama-server's arguments (relative to the release dir, its units' working directory): the target alone."""
    own = PlainSettings.model_validate(runtime.get(NAME) or {})
    batch = batch_size or own.batch_size
    return ["--model", MODEL, "--host", str(runtime.get("host") or "127.0.0.1"), "--port", str(port),
            "--ctx-size", str(ctx or runtime["ctx_size"]), "--parallel", str(parallel or runtime["parallel"]),
            "--threads", str(own.threads), "--batch-size", str(batch), "--n-gpu-layers", "0", "--no-webui", "--metrics",
            *runtime.get("extra_args", [])]


def requantized(job: ConvertJob) -> None:
    """Its own format, ``plain-q8``: the target's GGUF (made by the built-in step before this one) requantized to
    Q8_0 by the host build's llama-quantize, kept in the store by what it was made from."""
    from edgekit.build import host_build_for_tests

    target = next((m for m in job.result.models if m.role == "target"), None)
    if target is None:
        raise EdgekitError(f"Engine {NAME} needs a target it can convert to GGUF; recipe {job.recipe.name} has none.")
    built = host_build_for_tests()
    key = Store.key({"format": FORMAT, "source": target.artifact.key, "llama": built.artifact.key})
    art = None if job.force else job.store.get(FORMAT, key)
    cached = art is not None
    if art is None:
        job.say(f"target: llama-quantize → {FORMAT}")
        work = job.store.staging_dir()
        subprocess.run([str(built.bin_dir / "llama-quantize"), "--allow-requantize", str(target.file),
                        str(work / "model.gguf"), "Q8_0"], check=True, capture_output=True, timeout=600,
                       env={**os.environ, "LD_LIBRARY_PATH": str(built.bin_dir)})
        art = job.store.put(FORMAT, key, work, {"source": target.artifact.key, "type": "Q8_0"})
    path = art.file("model.gguf")
    job.result.formats.setdefault(FORMAT, []).append(
        {"role": "target", "file": str(path), "key": key, "cached": cached, "size": path.stat().st_size})


def target_gguf(recipe: Recipe, src: str | None, say: Any) -> Path:
    """The recipe's target in its own format, from the store (made once, by whichever deploy came first)."""
    if recipe.drafter is not None or recipe.runtime.spec_type != "none":
        raise EdgekitError(f"Engine {NAME} serves the target alone; recipe {recipe.name} asks for speculative "
                           "decoding.")
    from edgekit.prepare.pipeline import convert_recipe

    result = convert_recipe(recipe, src=src, say=lambda m: say(f"convert: {m}"), formats=Plain.model_formats,
                            converters=Plain.converters)
    return Path(result.formats[FORMAT][0]["file"])


def has_chat_template(gguf: Path) -> bool:
    from edgekit.convert.gguf_io import GGUFFile

    return "tokenizer.chat_template" in GGUFFile(gguf).kv_raw


class Plain(EngineBase):
    name = NAME
    # its health dialect: the OpenAI API (/v1/completions, /v1/chat/completions), its drafts from the counters
    # llama-server keeps in /metrics (tools/server/server-task.cpp at the pin), not llama.cpp's `timings`
    health_api = "openai"
    draft_counters = ("llamacpp:spec_decode_num_draft_tokens", "llamacpp:spec_decode_num_accepted_tokens")
    color = "#9467bd"
    settings_section, Settings = NAME, PlainSettings
    spec_types = ("none",)  # the target alone
    model_formats = ("gguf", FORMAT)  # the built-in GGUF step first: its own step requantizes that GGUF
    converters: ClassVar[dict[str, Any]] = {FORMAT: requantized}
    key_env = "LLAMA_API_KEY"
    open_without_key = ("/models", "/v1/models")  # llama-server's public endpoints
    bench_options = (EngineOption("batch_size", "--plain-batch-size", "The bench's servers with this --batch-size "
                                  "instead of the release's.", metavar="N", type=int),)

    def release(self, ctx: ReleaseContext) -> EngineRelease:
        if ctx.facts.arch not in ("x86_64", "amd64"):
            raise EdgekitError(f"Engine {NAME} runs the host build: board {ctx.name!r} ({ctx.facts.arch}) is not a "
                               "simulated x86_64 board.")
        from edgekit.build import host_build_for_tests

        stages: dict[str, float] = {}
        t = time.monotonic()
        ctx.say("llama-server: the host build")
        built = host_build_for_tests()
        stages["build"] = time.monotonic() - t
        t = time.monotonic()
        ctx.say("model: the target alone")
        model = target_gguf(ctx.recipe, ctx.src, ctx.say)
        stages["models"] = time.monotonic() - t

        # the libraries llama-server links (the other tools' *-impl.so stay behind), found through lib/
        libs = sorted(p for p in built.bin_dir.iterdir() if p.is_file() and ".so" in p.name
                      and (not p.name.endswith("-impl.so") or p.name == "libllama-server-impl.so"))
        files = {SERVER: built.bin_dir / "llama-server", MODEL: model, **{f"lib/{p.name}": p for p in libs},
                 **agent_files()}
        rt = ctx.recipe.runtime.model_dump(mode="json")
        ports = service_ports(ctx.board.service_port, ctx.recipe.runtime.port)
        # runtime.auth: key — llama-server takes its key from LLAMA_API_KEY (common/arg.cpp, --api-key's
        # variable): its unit's environment file gives it, and no argument names the key or its file
        auth = auth_fields(ctx.recipe.runtime.auth, ctx.facts.base, self.key_env)
        describe = {
            "engine": NAME, "recipe": ctx.recipe.name, "sources": ctx.recipe.sources,
            "server_args": server_argv(rt, ports[0]), "port": ports[0], "candidate_port": ports[1],
            "drafter": False, "spec_type": "none", "gpu": "none", "media": [], "chat": has_chat_template(model),
            "build": {"key": built.artifact.key, "target": "host"}, "runtime": rt, **auth,
            "draft_counters": list(self.draft_counters),
        }

        def render(rid: str) -> dict[str, str]:
            return service_units(ctx.facts.base, rid, lambda rdir, port: [f"{rdir}/{SERVER}", *server_argv(rt, port)],
                                 ports, ctx.recipe.runtime, env_file=auth.get("api_env_file"),
                                 key_file=auth.get("api_key_file"), user=ctx.facts.service_user)

        return EngineRelease(plan_release(ctx.recipe.name, files, describe, render), built.to_dict(), stages)

    # --- bench: the release's server on the bench port; no drafter, so the baseline alone -------------------

    def bench_configs(self, manifest: dict[str, Any], release_dir: str, board: Board, port: int,
                      parallel: int | None, slot_ctx: int | None, options: Mapping[str, Any]) -> list[ServerConfig]:
        rt = manifest["runtime"]
        slots = parallel or int(rt["parallel"])
        ctx = max(int(rt["ctx_size"]), (slot_ctx or 0) * slots)
        settings = {"spec_type": "none", "draft_n_max": None, "draft_p_min": None, "parallel": slots, "ctx_size": ctx}
        return [ServerConfig("baseline", server_argv(rt, port, slots, ctx, options.get("batch_size")), False, settings,
                             exe=[f"{release_dir}/{SERVER}"], api="llama")]

    def tune_point(self, drafter: ServerConfig, n: int, p_min: float | None) -> ServerConfig:
        raise EdgekitError(f"Engine {NAME} serves without a drafter: it has no draft length to tune.")
