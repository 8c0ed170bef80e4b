"""The LiteRT-LM engine: the recipe's `.litertlm` bundle (target + edgekit's MTP drafter section) served by
the agent's llama-server-compatible front (`agent/litert_server.py`) in the board's LiteRT-LM Python.

A release holds models/model.litertlm (LiteRT-LM picks the format by that extension), the agent, and the
units that run ``<python> agent/litert_server.py --model … [--speculative --draft-steps G]``. G is fixed
when the bundle is exported (the drafter's verify step), so it is the recipe's ``draft_n_max`` at convert
time. Health and acceptance are llama-server's: the front answers `/health` and `/completion` with
`timings.draft_n` / `draft_n_accepted` (from LiteRT-LM's streamed verify passes). The board's LiteRT-LM
is the board file's `litert_python` (sim boards: the LiteRT venv `.ci/install` makes), else `python3`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgekit.config.boardfile import Board
from edgekit.config.recipes import Recipe
from edgekit.engines.base import EngineRelease, ReleaseContext
from edgekit.engines.capabilities import EngineBase
from edgekit.errors import EdgekitError
from edgekit.release.plan import ReleasePlan, agent_files, plan_release, service_ports, service_units
from edgekit.remote.runner import LocalRunner, SshRunner
from edgekit.store import Store

if TYPE_CHECKING:
    from edgekit.engines.benchconf import BenchSite, ServerConfig

Runner = SshRunner | LocalRunner
BUNDLE = "models/model.litertlm"


def bundle_for(recipe: Recipe, store: Store | None = None,
               say: Callable[[str], None] = lambda _m: None) -> dict[str, Any]:
    """The recipe's LiteRT-LM bundle (exported once, then from the store), whatever its ``convert.litert``."""
    from edgekit.prepare.pipeline import convert_recipe

    if recipe.drafter is not None and recipe.runtime.spec_type != "draft-mtp":
        raise EdgekitError(f"Recipe {recipe.name} drafts with {recipe.runtime.spec_type}; LiteRT-LM drafts with "
                           "an MTP drafter only (spec_type draft-mtp).")
    result = convert_recipe(recipe, store, say=say, formats=("litertlm",))
    if not result.litert:
        raise EdgekitError(f"Recipe {recipe.name}'s target is not converted by edgekit (a package): "
                           "there is no LiteRT-LM bundle to serve.")
    return result.litert[0]


def board_python(runner: Runner, board_name: str, python: str, flag: str = "`litert_python` in the board file") -> str:
    """``python`` if it can import ``litert_lm`` on the board, else one clear sentence."""
    res = runner.run([python, "-c", "import litert_lm"], check=False, timeout=120)
    if not res.ok:
        raise EdgekitError(f"Board {board_name!r}: {python} cannot import litert_lm; install litert-lm-api==0.18.1 "
                           f"there (pip) or name a Python that has it with {flag}.")
    return python


def python_of(board: Board) -> str:
    return board.litert_python or "python3"


def front_argv(python: str, rdir: str, bundle: str, host: str, port: int, cache_length: int,
               draft_steps: int | None, accelerator: str, cache_dir: str) -> list[str]:
    """The front on ``port``: the bundle with its MTP drafter when ``draft_steps``, else the target alone."""
    argv = [python, f"{rdir}/agent/litert_server.py", "--model", bundle, "--host", host, "--port", str(port),
            "--ctx", str(cache_length), "--cache-dir", cache_dir, "--accelerator", accelerator]
    return [*argv, "--speculative", "--draft-steps", str(draft_steps)] if draft_steps else argv


def compose(ctx: ReleaseContext, python: str, bundle: dict[str, Any]) -> ReleasePlan:
    recipe, rt = ctx.recipe, ctx.recipe.runtime
    steps = bundle.get("draft_steps") if "tf_lite_mtp_drafter" in (bundle.get("model_types") or []) else None
    ports = service_ports(ctx.board.service_port, rt.port)
    cache_length = int(bundle["cache_length"])

    def argv_at(rdir: str, port: int) -> list[str]:
        # One compiled-model cache per port: the main and the candidate server may run side by side.
        return front_argv(python, rdir, f"{rdir}/{BUNDLE}", rt.host, port, cache_length, steps,
                          rt.litert.accelerator, f"{rdir}/litert-cache-{port}")

    describe = {
        "engine": "litert-lm", "recipe": recipe.name, "port": ports[0], "candidate_port": ports[1],
        "sources": recipe.sources,
        "server_args": argv_at("$RELEASE", ports[0])[1:], "drafter": bool(steps),
        "spec_type": "litert-mtp" if steps else "none", "runtime": rt.model_dump(mode="json"), "guards": [],
        "gpu": "none", "litert": {k: bundle.get(k) for k in ("key", "model_types", "draft_steps", "cache_length")},
        "chat": bool(bundle.get("chat_template")),  # the front renders the bundle's template (health uses it)
    }

    def render(rid: str) -> dict[str, str]:
        return service_units(ctx.facts.base, rid, argv_at, ports, "LiteRT-LM", recipe.name, rt.env)

    return plan_release(recipe.name, {BUNDLE: Path(bundle["file"]), **agent_files()}, describe, render)


class Litert(EngineBase):
    name = "litert-lm"
    health_api = "llama"  # the front speaks llama-server's /completion with `timings`
    color = "#d62728"
    tunes_by_export = True  # the drafter's verify step is fixed in the bundle: one bundle per draft length
    benches_model = True  # `bench --backend litert-lm`: the recipe's bundle without a release

    def bench_configs(self, manifest: dict[str, Any], release_dir: str, board: Board, port: int,
                      parallel: int | None, slot_ctx: int | None) -> list[ServerConfig]:
        from edgekit.engines import litert_bench

        return litert_bench.release_configs(manifest, release_dir, python_of(board), port)

    def check_bench_fits(self, manifest: dict[str, Any], release_id: str, fits: Callable[[int], bool]) -> None:
        from edgekit.engines import litert_bench

        litert_bench.check_fits(manifest, release_id, fits)

    def tune_drafters(self, site: BenchSite, manifest: dict[str, Any], recipe: Recipe, draft_n: list[int],
                      p_mins: list[float | None] | None, parallel: list[int] | None) -> list[ServerConfig]:
        from edgekit.engines import litert_bench

        return litert_bench.tune_drafters(site, manifest, recipe, draft_n, p_mins, parallel)

    def bench_model(self, recipe: Recipe, fits: Callable[[int], bool], say: Callable[[str], None]) -> Any:
        from edgekit.engines import litert_bench

        return litert_bench.bench_model(recipe, fits, say)

    def model_configs(self, site: BenchSite, model: Any, python: str | None,
                      accelerator: str) -> list[ServerConfig]:
        from edgekit.engines import litert_bench

        return litert_bench.model_configs(site, model, python, accelerator)

    def model_record(self, model: Any) -> dict[str, Any]:
        from edgekit.engines import litert_bench

        return litert_bench.model_record(model)

    def report_what(self, doc: dict[str, Any]) -> str | None:
        from edgekit.engines import litert_bench

        return litert_bench.report_what(doc)

    def release(self, ctx: ReleaseContext) -> EngineRelease:
        python = board_python(ctx.runner, ctx.name, python_of(ctx.board))
        ctx.say(f"LiteRT-LM on the board ({python})")
        t = time.monotonic()
        ctx.say("models (.litertlm bundle: target + MTP drafter section)")
        bundle = bundle_for(ctx.recipe, say=lambda m: ctx.console.print(f"[dim]models: {m}[/dim]"))
        stages = {"models": time.monotonic() - t}
        return EngineRelease(compose(ctx, python, bundle), {"engine": "litert-lm", "bundle": bundle["key"]}, stages)
