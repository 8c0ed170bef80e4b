"""llama.cpp's releases for a fleet: built once per build target (the boards' profile, or "host" for
simulated boards) and JetPack line, the models converted once per recipe, and deploy's own ``compose()``
for each distinct (build, base directory, service port): boards that share those share one release id.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rich.console import Console

from edgekit.config.recipes import Recipe
from edgekit.engines.capabilities import FleetBoard, FleetReleases
from edgekit.engines.llamacpp import check_glibc, choose_build, compose, llama_src, server_help
from edgekit.release.plan import ReleasePlan


def fleet_releases(recipe: Recipe, targets: Mapping[str, FleetBoard], src: str | None, cuda: str,
                   console: Console) -> FleetReleases:
    from edgekit.build import BuildOptions, build
    from edgekit.engines.llamacpp_models import resolve_models

    src = llama_src(src)
    result = FleetReleases()
    built: dict[str, tuple[Path, str, str]] = {}  # build target → (bin dir, key, --help)
    manifests: dict[str, dict[str, Any]] = {}
    composed: dict[tuple[str, str, int | None], ReleasePlan] = {}
    models: dict[str, Path] | None = None
    for name, t in targets.items():
        # One build per board kind and JetPack line: an Orin on JetPack 6 and one on 7.2 get different builds,
        # an emulated Orin (no GPU driver) the CPU build of its profile.
        choice = choose_build(t.board, t.facts, cuda)
        target = choice.target
        kind_key = target if target == "host" else f"{target}@{'cpu' if choice.cpu_only else t.facts.cuda}"
        if kind_key not in built:
            console.print(f"[dim]fleet: build llama.cpp for {kind_key}[/dim]")
            art = build(BuildOptions(target=target, cpu_only=choice.cpu_only, src=src, board_cuda=t.facts.cuda,
                                     board_jetpack=t.facts.jetpack), console=console, runner=t.runner)
            built[kind_key] = (art.bin_dir, art.artifact.key, server_help(art))
            result.builds[kind_key] = art.artifact.key
            manifests[kind_key] = art.artifact.manifest
        check_glibc(manifests[kind_key], t.facts)
        if models is None:
            console.print("[dim]fleet: models[/dim]")
            models = resolve_models(recipe, console, src)
        bin_dir, key, help_text = built[kind_key]
        kind = (kind_key, t.facts.base, t.board.service_port)
        if kind not in composed:
            composed[kind] = compose(recipe, t.board, t.facts.base, bin_dir, key, help_text, models, target,
                                     choice.gpu)
        result.plans[name] = composed[kind]
    return result
