"""The bench's server configurations for a release on the board, whatever its engine.

Each engine's release says how it serves (``release.json``: its ``server_args``); the bench moves that
server to the bench port with enough slots and context, and makes the pair it measures: as deployed
(with the drafter) and without speculative decoding (the baseline). ``tune_point`` changes only the
drafter's length (and slots) the way that engine spells it.
"""

from __future__ import annotations

import json

from edgekit.bench import litert_backend, serverconf, vllm_backend
from edgekit.bench.serverconf import ServerConfig
from edgekit.bench.session import BoardRelease
from edgekit.config.boardfile import Board
from edgekit.engines.litert import python_of as litert_python_of
from edgekit.errors import EdgekitError


def configs(rel: BoardRelease, board: Board, port: int, parallel: int | None,
            slot_ctx: int | None) -> list[ServerConfig]:
    """[drafter, baseline] of ``rel`` on the bench port (only the baseline when it does not draft)."""
    if rel.engine == "vllm":
        out = vllm_backend.configs(rel.manifest, rel.dir, vllm_backend.board_python(board), port, parallel, slot_ctx)
    elif rel.engine == "litert-lm":
        out = litert_backend.release_configs(rel.manifest, rel.dir, litert_python_of(board), port)
    else:
        out = serverconf.pair(list(rel.manifest.get("server_args") or []), port, parallel, slot_ctx)
    for c in out:
        c.release_dir = rel.dir
        c.settings["engine"] = rel.engine
        c.media = list(rel.manifest.get("media") or [])  # the release serves an mmproj (llama.cpp)
    return out


def tune_point(rel: BoardRelease, drafter: ServerConfig, n: int, p_min: float | None) -> ServerConfig:
    """The drafter configuration with draft length ``n`` (and p-min) in ``rel.engine``'s spelling."""
    args = list(drafter.args)
    if rel.engine == "llama.cpp":
        args = serverconf.put(args, "draft_n_max", n)
        args = serverconf.drop(args, "draft_p_min") if p_min is None else serverconf.put(args, "draft_p_min", p_min)
        if int(serverconf.get(args, "draft_n_min") or 0) > n:
            args = serverconf.put(args, "draft_n_min", n)
        settings = {**drafter.settings, **serverconf.describe(args)}
    elif rel.engine == "vllm":
        if p_min is not None:
            raise EdgekitError("vLLM's MTP drafter has no p-min: tune it with --draft-n (num_speculative_tokens) "
                               "and --p-min default.")
        i = args.index(vllm_backend.SPEC)
        args[i + 1] = json.dumps({**json.loads(args[i + 1]), "num_speculative_tokens": n}, separators=(",", ":"))
        settings = dict(drafter.settings)
    else:
        raise EdgekitError(f"{rel.engine}'s draft length is fixed when its model is exported: tune sweeps it "
                           "with one bundle per length (tune.litert_configs), not by server flags.")
    settings.update(draft_n_max=n, draft_p_min=p_min)
    return ServerConfig(drafter.name, args, True, settings, drafter.exe, drafter.env, drafter.api, drafter.model,
                        drafter.release_dir)
