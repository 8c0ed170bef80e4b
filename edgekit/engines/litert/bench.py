"""LiteRT-LM's bench and tune configurations: a release's, and for `edgekit bench --backend litert-lm` the
recipe's `.litertlm` bundle (target + MTP drafter) on the board without a release.

The bench stays the same — sampler, idle baseline, the deployed service stopped and put back, A/B
repetitions, the agent's streaming load, power windows, the results schema — only the server differs:
the agent's ``litert_server.py`` (a llama-server-compatible front for LiteRT-LM, CPU backend), run
by the board's LiteRT-LM Python, with the drafter (``--speculative``) and without it (the baseline).
llama-bench and the GGUF roofline are llama.cpp's, so they are left out.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import Any

from edgekit.config.boardfile import Board
from edgekit.config.recipes import Recipe
from edgekit.engines.benchconf import BenchSite, ServerConfig
from edgekit.engines.litert.front import BUNDLE, agent_front, board_python, bundle_for, front_args, python_of
from edgekit.engines.litert.settings import of as own
from edgekit.errors import EdgekitError


def blob_of(path: Path) -> tuple[str, int]:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest(), path.stat().st_size


def configs(front: list[str], bundle: str, port: int, cache_length: int,
            draft_steps: int | None, accelerator: str = "cpu", cache_dir: str | None = None) -> list[ServerConfig]:
    """[drafter, baseline] on the bench port: the same bundle, LiteRT-LM's MTP drafter on and off, the front
    (``front``: how it is run, a release's file or the agent's verb) with the options a release's units give it."""
    cache = cache_dir or str(PurePosixPath(bundle).parent / "litert-cache")  # beside the bundle: removed with it
    n = len(front)

    def argv(steps: int | None) -> list[str]:
        return [*front, *front_args(bundle, "127.0.0.1", port, cache_length, steps, accelerator, cache)]

    settings = {"backend": "litert-lm", "accelerator": accelerator, "ctx_size": cache_length, "parallel": 1}
    out = []
    if draft_steps:
        spec = argv(draft_steps)
        out.append(ServerConfig("drafter", spec[n:], True,
                                {**settings, "spec_type": "litert-mtp", "draft_n_max": draft_steps}, spec[:n]))
    base = argv(None)
    out.append(ServerConfig("baseline", base[n:], False, {**settings, "spec_type": "none", "draft_n_max": None},
                            base[:n]))
    return out


def release_configs(manifest: dict[str, Any], release_dir: str, python: str, port: int) -> list[ServerConfig]:
    """[drafter, baseline] of a deployed LiteRT-LM release (engine: litert-lm), moved to the bench port."""
    lit = manifest.get("litert") or {}
    accelerator = own(manifest.get("runtime") or {}).accelerator
    return configs([python, f"{release_dir}/agent/litert_server.py"], f"{release_dir}/{BUNDLE}", port,
                   int(lit["cache_length"]), lit.get("draft_steps") if manifest.get("drafter") else None,
                   accelerator, f"{release_dir}/litert-cache-{port}")


def push_bundle(runner: Any, base: str, path: Path, work: str) -> str:
    """The bundle into the board's content-addressed store (sent only if missing), linked into ``work``.

    LiteRT-LM picks the file format by its extension: the store's name (a sha256) has none.
    """
    from edgekit.remote.transfer import Blob, push_blobs, resolve_base, store_path

    sha, size = blob_of(path)
    push_blobs(runner, base, [Blob(sha, size, path)])
    link = f"{work}/model.litertlm"
    runner.run(["mkdir", "-p", work], timeout=30)
    runner.run(["ln", "-sfn", store_path(resolve_base(runner, base), sha), link], timeout=30)
    return link


def tune_drafters(site: BenchSite, manifest: dict[str, Any], recipe: Recipe, draft_n: list[int],
                  p_mins: list[float | None] | None, parallel: list[int] | None) -> list[ServerConfig]:
    """LiteRT-LM's draft length is fixed when the bundle is exported: one bundle per length (exported once,
    then from the store), each pushed into the bench's work dir. The release itself is the baseline."""
    if parallel or any(p is not None for p in p_mins or []):
        raise EdgekitError("LiteRT-LM serves one request at a time and its MTP drafter has no p-min: tune it with "
                           "--draft-n alone.")
    lit = manifest.get("litert") or {}
    out = []
    for n in draft_n:
        site.say(f"LiteRT-LM bundle drafting {n} (exported once per draft length)")
        variant = recipe.model_copy(update={"runtime": recipe.runtime.model_copy(update={"draft_n_max": n})})
        bundle = bundle_for(variant)
        remote = push_bundle(site.runner, site.base, Path(bundle["file"]), f"{site.work}/n{n}")
        (cfg,) = [c for c in configs(agent_front(python_of(site.board), site.agent), remote, site.port,
                                     int(lit.get("cache_length") or bundle["cache_length"]), n,
                                     own(recipe.runtime).accelerator) if c.speculative]
        cfg.name = f"n{n}-pdef"
        cfg.settings.update(draft_p_min=None, parallel=1)
        out.append(cfg)
    return out


def check_fits(manifest: dict[str, Any], release_id: str, fits: Callable[[int], bool]) -> None:
    """A release's bundle holds a fixed KV cache: the bench's longest prompt + n_gen must fit in it."""
    cache = (manifest.get("litert") or {}).get("cache_length")
    if cache and not fits(int(cache)):
        raise EdgekitError(f"The LiteRT-LM release {release_id}'s KV cache holds {cache} tokens, fewer than the "
                           "bench's longest prompt + n_gen; raise convert.litert_cache_length and deploy it again.")


def bench_model(recipe: Recipe, fits: Callable[[int], bool], say: Callable[[str], None]) -> dict[str, Any]:
    """The recipe's bundle, made on the host before the board is touched (``bench --backend litert-lm``)."""
    bundle = bundle_for(recipe, say=say)
    if not fits(bundle["cache_length"]):
        raise EdgekitError(f"The LiteRT-LM bundle's KV cache holds {bundle['cache_length']} tokens, fewer than the "
                           f"bench's longest prompt + n_gen; raise convert.litert_cache_length in {recipe.name}.")
    return bundle


def _python(board: Board, python: str | None) -> str:
    """A simulated board runs on this machine: it has this machine's LiteRT-LM Python."""
    if python:
        return python
    if board.sim:
        from edgekit.convert.litert import litert_python

        return litert_python()
    return "python3"


def model_configs(site: BenchSite, bundle: dict[str, Any], python: str | None,
                  accelerator: str) -> list[ServerConfig]:
    """[drafter, baseline] of the recipe's bundle, pushed into the bench's work dir."""
    py = board_python(site.runner, site.base, site.name, _python(site.board, python), "--litert-python")
    site.say(f"pushing the LiteRT-LM bundle ({Path(bundle['file']).stat().st_size / 1e6:.1f} MB) to {site.name}")
    remote = push_bundle(site.runner, site.base, Path(bundle["file"]), site.work)
    return configs(agent_front(py, site.agent), remote, site.port, bundle["cache_length"], bundle.get("draft_steps"),
                   accelerator)


def model_record(bundle: dict[str, Any]) -> dict[str, Any]:
    """What the results document keeps of the bundle (``litert``)."""
    return {"litert": {k: bundle.get(k) for k in ("key", "model_types", "draft_steps", "cache_length")}}


def report_what(doc: dict[str, Any]) -> str | None:
    """The report's line of what ran, for a bundle measured without a release."""
    if doc.get("litert"):
        return f"LiteRT-LM (CPU), bundle `{doc['litert'].get('key', '?')[:12]}` with the MTP drafter · "
    return None


__all__ = ["bench_model", "blob_of", "check_fits", "configs", "model_configs", "model_record", "push_bundle",
           "release_configs", "report_what", "tune_drafters"]
