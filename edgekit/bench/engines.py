"""The bench's server configurations for a release on the board, whatever its engine.

Each engine's release says how it serves (``release.json``: its ``server_args``); the engine's class moves
that server to the bench port with enough slots and context, and makes the pair the bench measures: as
deployed (with the drafter) and without speculative decoding (the baseline). ``tune_point`` changes only
the drafter's length (and slots) the way that engine spells it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from edgekit.bench.session import BoardRelease
from edgekit.config.boardfile import Board
from edgekit.engines import get_engine
from edgekit.engines.benchconf import ServerConfig
from edgekit.release.manifest import ReleaseManifest


def configs(rel: BoardRelease, board: Board, port: int, parallel: int | None, slot_ctx: int | None,
            options: Mapping[str, Mapping[str, Any]] | None = None) -> list[ServerConfig]:
    """[drafter, baseline] of ``rel`` on the bench port (only the baseline when it does not draft); ``options``:
    engine name → the values of its bench options."""
    own = (options or {}).get(rel.engine) or {}
    out = get_engine(rel.engine).bench_configs(rel.manifest, rel.dir, board, port, parallel, slot_ctx, own)
    served = ReleaseManifest.of(rel.manifest)
    for c in out:
        c.env = {**c.env, **served.server_env}  # the server measured as it is served (a recipe's runtime.env)
        c.key_file, c.env_file = served.api_key_file or "", served.api_env_file or ""  # and with its key
        c.draft_counters = list(served.draft_counters or get_engine(rel.engine).draft_counters or ())
        c.release_dir = rel.dir
        c.settings["engine"] = rel.engine
        c.media = list(rel.manifest.get("media") or [])  # the release serves an mmproj (llama.cpp)
    return out


def tune_point(rel: BoardRelease, drafter: ServerConfig, n: int, p_min: float | None) -> ServerConfig:
    """The drafter configuration with draft length ``n`` (and p-min) in ``rel.engine``'s spelling."""
    return get_engine(rel.engine).tune_point(drafter, n, p_min)
