"""`edgekit bench --backend litert-lm`: the recipe's `.litertlm` bundle (target + MTP drafter) on the board.

The bench stays the same — sampler, idle baseline, the deployed service stopped and put back, A/B
repetitions, the agent's streaming load, power windows, the results schema — only the server differs:
the agent's ``litert_server.py`` (a llama-server-compatible front for LiteRT-LM, CPU backend), run
by the board's LiteRT-LM Python, with the drafter (``--speculative``) and without it (the baseline).
llama-bench and the GGUF roofline are llama.cpp's, so they are left out.
"""

from __future__ import annotations

import hashlib
from pathlib import Path, PurePosixPath
from typing import Any

from edgekit.bench.serverconf import ServerConfig
from edgekit.engines.litert import BUNDLE, front_argv


def blob_of(path: Path) -> tuple[str, int]:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest(), path.stat().st_size


def configs(python: str, agent_path: str, bundle: str, port: int, cache_length: int,
            draft_steps: int | None, accelerator: str = "cpu", cache_dir: str | None = None) -> list[ServerConfig]:
    """[drafter, baseline] on the bench port: the same bundle, LiteRT-LM's MTP drafter on and off, the front
    spelled as the release's units spell it (``engines.litert.front_argv``)."""
    root = str(PurePosixPath(agent_path).parent.parent)  # the front lives in <root>/agent/
    cache = cache_dir or str(PurePosixPath(bundle).parent / "litert-cache")  # beside the bundle: removed with it

    def argv(steps: int | None) -> list[str]:
        return front_argv(python, root, bundle, "127.0.0.1", port, cache_length, steps, accelerator, cache)

    settings = {"backend": "litert-lm", "accelerator": accelerator, "ctx_size": cache_length, "parallel": 1}
    out = []
    if draft_steps:
        spec = argv(draft_steps)
        out.append(ServerConfig("drafter", spec[2:], True,
                                {**settings, "spec_type": "litert-mtp", "draft_n_max": draft_steps}, spec[:2]))
    base = argv(None)
    out.append(ServerConfig("baseline", base[2:], False, {**settings, "spec_type": "none", "draft_n_max": None},
                            base[:2]))
    return out


def release_configs(manifest: dict[str, Any], release_dir: str, python: str, port: int) -> list[ServerConfig]:
    """[drafter, baseline] of a deployed LiteRT-LM release (engine: litert-lm), moved to the bench port."""
    lit = manifest.get("litert") or {}
    accelerator = ((manifest.get("runtime") or {}).get("litert") or {}).get("accelerator", "cpu")
    return configs(python, f"{release_dir}/agent/edgekit_agent.py", f"{release_dir}/{BUNDLE}", port,
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


__all__ = ["blob_of", "configs", "push_bundle", "release_configs"]
