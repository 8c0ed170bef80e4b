"""The LiteRT-LM engine: the recipe's `.litertlm` bundle (target + edgekit's MTP drafter section) served by
the agent's llama-server-compatible front (`agent/litert_server.py`) in the board's LiteRT-LM Python.

A release holds models/model.litertlm (LiteRT-LM picks the format by that extension), the agent, and the
units that run ``<python> agent/litert_server.py --model … [--speculative --draft-steps G]``. G is fixed
when the bundle is exported (the drafter's verify step), so it is the recipe's ``draft_n_max`` at convert
time. Health and acceptance are llama-server's: the front answers `/health` and `/completion` with
`timings.draft_n` / `draft_n_accepted` (from LiteRT-LM's streamed verify passes). The board's LiteRT-LM
is the board file's `litert.python` (sim boards: the LiteRT venv `.ci/install` makes), else `python3`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgekit.config.boardfile import Board
from edgekit.config.recipes import Recipe
from edgekit.engines.base import EngineRelease, ReleaseContext
from edgekit.engines.capabilities import EngineBase, EngineOption
from edgekit.engines.litert import bench as litert_bench
from edgekit.engines.litert.front import BUNDLE, board_python, bundle_for, front_argv, python_of
from edgekit.engines.litert.settings import SECTION, LitertBoardSettings, LitertSettings
from edgekit.engines.litert.settings import of as own
from edgekit.release.auth import auth_fields
from edgekit.release.chat_template import served_path, template_files
from edgekit.release.plan import ReleasePlan, agent_files, plan_release, service_ports, service_units
from edgekit.release.units import run_as_fields

if TYPE_CHECKING:
    from edgekit.engines.benchconf import BenchSite, ServerConfig

def compose(ctx: ReleaseContext, python: str, bundle: dict[str, Any]) -> ReleasePlan:
    recipe, rt = ctx.recipe, ctx.recipe.runtime
    steps = bundle.get("draft_steps") if "tf_lite_mtp_drafter" in (bundle.get("model_types") or []) else None
    ports = service_ports(ctx.board.service_port, rt.port)
    cache_length = int(bundle["cache_length"])
    auth = auth_fields(rt.auth, ctx.facts.base)

    def argv_at(rdir: str, port: int) -> list[str]:
        # One compiled-model cache per port: the main and the candidate server may run side by side.
        return front_argv(python, rdir, f"{rdir}/{BUNDLE}", rt.host, port, cache_length, steps,
                          own(rt).accelerator, f"{rdir}/litert-cache-{port}", auth.get("api_key_file"),
                          served_path(rdir, rt.chat_template))

    describe = {
        "engine": "litert-lm", "recipe": recipe.name, "port": ports[0], "candidate_port": ports[1],
        "sources": recipe.sources,
        "server_args": argv_at("$RELEASE", ports[0])[1:], "drafter": bool(steps),
        "spec_type": "litert-mtp" if steps else "none", "runtime": Litert().served_runtime(rt), "guards": [],
        "gpu": "none", "litert": {k: bundle.get(k) for k in ("key", "model_types", "draft_steps", "cache_length")},
        "chat": bool(bundle.get("chat_template")),  # the front renders the bundle's template (health uses it)
        **auth, **run_as_fields(ctx.facts.service_user),
    }

    def render(rid: str) -> dict[str, str]:
        # The front writes its compiled-model caches in the release (litert-cache-PORT, made at its first start).
        return service_units(ctx.facts.base, rid, argv_at, ports, rt, key_file=auth.get("api_key_file"),
                             user=ctx.facts.service_user, writable_at=lambda rdir, _port: [rdir])

    files = {BUNDLE: Path(bundle["file"]), **template_files(rt.chat_template), **agent_files()}
    return plan_release(recipe.name, files, describe, render)


class Litert(EngineBase):
    name = "litert-lm"
    health_api = "llama"  # the front speaks llama-server's /completion with `timings`
    model_formats = ("litertlm",)
    color = "#d62728"
    settings_section, Settings, BoardSettings = SECTION, LitertSettings, LitertBoardSettings
    tunes_by_export = True  # the drafter's verify step is fixed in the bundle: one bundle per draft length
    benches_model = True  # `bench --backend litert-lm`: the recipe's bundle without a release
    bench_options = (  # for `bench --backend litert-lm`
        EngineOption("python", "--litert-python", "The board's Python with litert_lm (default: the board file's "
                     "litert.python, else python3; a simulated board: this machine's).", metavar="PATH"),
        EngineOption("accelerator", "--litert-accelerator", "LiteRT-LM's backend on the board (gpu: its GPU "
                     "delegate, where the board's build has one).", choices=("cpu", "gpu"), default="cpu"),
    )

    def bench_configs(self, manifest: dict[str, Any], release_dir: str, board: Board, port: int,
                      parallel: int | None, slot_ctx: int | None, options: Mapping[str, Any]) -> list[ServerConfig]:
        return litert_bench.release_configs(manifest, release_dir, python_of(board), port)

    def check_bench_fits(self, manifest: dict[str, Any], release_id: str, fits: Callable[[int], bool]) -> None:
        litert_bench.check_fits(manifest, release_id, fits)

    def tune_drafters(self, site: BenchSite, manifest: dict[str, Any], recipe: Recipe, draft_n: list[int],
                      p_mins: list[float | None] | None, parallel: list[int] | None) -> list[ServerConfig]:
        return litert_bench.tune_drafters(site, manifest, recipe, draft_n, p_mins, parallel)

    def bench_model(self, recipe: Recipe, fits: Callable[[int], bool], say: Callable[[str], None]) -> Any:
        return litert_bench.bench_model(recipe, fits, say)

    def model_configs(self, site: BenchSite, model: Any, options: Mapping[str, Any]) -> list[ServerConfig]:
        return litert_bench.model_configs(site, model, options.get("python"), options.get("accelerator") or "cpu")

    def model_record(self, model: Any) -> dict[str, Any]:
        return litert_bench.model_record(model)

    def report_what(self, doc: dict[str, Any]) -> str | None:
        return litert_bench.report_what(doc)

    def release(self, ctx: ReleaseContext) -> EngineRelease:
        python = board_python(ctx.runner, ctx.facts.base, ctx.name, python_of(ctx.board))
        ctx.say(f"LiteRT-LM on the board ({python})")
        t = time.monotonic()
        ctx.say("models (.litertlm bundle: target + MTP drafter section)")
        bundle = bundle_for(ctx.recipe, say=lambda m: ctx.console.print(f"[dim]models: {m}[/dim]"))
        stages = {"models": time.monotonic() - t}
        return EngineRelease(compose(ctx, python, bundle), {"engine": "litert-lm", "bundle": bundle["key"]}, stages)
