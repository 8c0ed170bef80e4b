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
from edgekit.engines.litert import board_python, bundle_for


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


def release_configs(manifest: dict[str, Any], release_dir: str, python: str, port: int) -> list[ServerConfig]:
    """[drafter, baseline] of a deployed LiteRT-LM release (engine: litert-lm), moved to the bench port."""
    args = [a.replace("$RELEASE", release_dir) for a in manifest.get("server_args") or []]
    front, args = [python, args[0]], args[1:]
    args[args.index("--port") + 1] = str(port)
    base = [a for a in args if a != "--speculative"]
    if "--draft-steps" in base:
        i = base.index("--draft-steps")
        del base[i:i + 2]
    lit = manifest.get("litert") or {}
    acc = args[args.index("--accelerator") + 1] if "--accelerator" in args else "cpu"
    settings = {"backend": "litert-lm", "accelerator": acc, "ctx_size": lit.get("cache_length"), "parallel": 1}
    out = []
    if "--speculative" in args:
        out.append(ServerConfig("drafter", args, True, {**settings, "spec_type": "litert-mtp",
                                                        "draft_n_max": lit.get("draft_steps")}, front))
    out.append(ServerConfig("baseline", base, False, {**settings, "spec_type": "none", "draft_n_max": None}, front))
    return out


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


__all__ = ["blob_of", "board_python", "bundle_for", "configs", "push_bundle", "release_configs"]
