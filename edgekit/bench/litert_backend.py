"""`edgekit bench --backend litert-lm`: the recipe's `.litertlm` bundle (target + MTP drafter) on the board.

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

from edgekit.bench.serverconf import ServerConfig
from edgekit.config.recipes import Recipe
from edgekit.errors import EdgekitError
from edgekit.store import Store


def bundle_for(recipe: Recipe, store: Store | None = None,
               say: Callable[[str], None] = lambda _m: None) -> dict[str, Any]:
    """The recipe's LiteRT-LM bundle (exported once, then from the store), whatever its ``convert.litert``."""
    from edgekit.convert.pipeline import convert_recipe

    if recipe.drafter is not None and recipe.runtime.spec_type != "draft-mtp":
        raise EdgekitError(f"Recipe {recipe.name} drafts with {recipe.runtime.spec_type}; LiteRT-LM drafts with "
                           "an MTP drafter only (spec_type draft-mtp).")
    spec = recipe.convert.model_copy(update={"litert": True, "gguf": False})
    result = convert_recipe(recipe.model_copy(update={"convert": spec}), store, say=say)
    if not result.litert:
        raise EdgekitError(f"Recipe {recipe.name}'s target is not converted by edgekit (a package): "
                           "there is no LiteRT-LM bundle to bench.")
    return result.litert[0]


def blob_of(path: Path) -> tuple[str, int]:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest(), path.stat().st_size


def configs(python: str, agent_path: str, bundle: str, port: int, cache_length: int,
            draft_steps: int | None, accelerator: str = "cpu") -> list[ServerConfig]:
    """[drafter, baseline] on the bench port: the same bundle, LiteRT-LM's MTP drafter on and off."""
    front = [python, str(PurePosixPath(agent_path).parent / "litert_server.py")]
    cache = str(PurePosixPath(bundle).parent / "litert-cache")  # in the bench work dir: removed with it
    base = ["--model", bundle, "--port", str(port), "--ctx", str(cache_length), "--cache-dir", cache,
            "--accelerator", accelerator]
    settings = {"backend": "litert-lm", "accelerator": accelerator, "ctx_size": cache_length, "parallel": 1}
    out = []
    if draft_steps:
        out.append(ServerConfig("drafter", [*base, "--speculative", "--draft-steps", str(draft_steps)], True,
                                {**settings, "spec_type": "litert-mtp", "draft_n_max": draft_steps}, front))
    out.append(ServerConfig("baseline", base, False, {**settings, "spec_type": "none", "draft_n_max": None}, front))
    return out


def board_python(runner: Any, board_name: str, python: str) -> str:
    """``python`` if it can import ``litert_lm`` on the board, else one clear error."""
    res = runner.run([python, "-c", "import litert_lm"], check=False, timeout=120)
    if not res.ok:
        raise EdgekitError(f"Board {board_name!r}: {python} cannot import litert_lm; install litert-lm-api==0.18.1 "
                           "there (pip) or name a Python that has it with --litert-python.")
    return python


def push_bundle(runner: Any, base: str, path: Path, work: str) -> str:
    """The bundle into the board's content-addressed store (sent only if missing), linked into ``work``.

    LiteRT-LM picks the file format by its extension: the store's name (a sha256) has none.
    """
    from edgekit.remote.transfer import Blob, push_blobs, resolve_base, store_path

    sha, size = blob_of(path)
    push_blobs(runner, base, [Blob(sha, size, path)])
    link = f"{work}/model.litertlm"
    runner.run(["ln", "-sfn", store_path(resolve_base(runner, base), sha), link], timeout=30)
    return link


__all__ = ["blob_of", "board_python", "bundle_for", "configs", "push_bundle"]
