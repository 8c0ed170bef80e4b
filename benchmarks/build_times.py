"""Build times of llama.cpp per target: cold, with a warm ccache, and cached in the store.

    python benchmarks/build_times.py                      # host + orin (CPU) cross, all modes
    python benchmarks/build_times.py --targets thor --cuda --modes cached
    python benchmarks/build_times.py --json

- cold:   fresh build dir, fresh store, ccache disabled: what a new CI machine pays.
- first:  the real build dir, store and ccache, which must not hold this build yet: what a new
          machine pays, and it leaves the build in the store and ccache (a CUDA build is too long to
          pay twice, once for `cold` and once more to fill the store).
- ccache: fresh build dir and store, ccache on (warm after an earlier build of the same flags).
- cached: the same inputs again against the real store: the build is skipped (goal ≤ 1 s).

    python benchmarks/build_times.py --targets orin,thor --cuda --jetpack 7.2 --modes first,cached

One build at a time (edgekit takes a machine-wide lock); a cold build is ≈ 4–5 min on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from edgekit.build import KIND, BuildOptions, build, build_key, fetch_sdist, prepare
from edgekit.paths import cache_dir
from edgekit.store import Store

MODES = ("cold", "first", "ccache", "cached")


def timed(options: BuildOptions, store: Store, env: dict[str, str]) -> tuple[float, bool]:
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        start = time.monotonic()
        result = build(options, store=store)
        return time.monotonic() - start, result.cached
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def measure(target: str, cuda: bool, modes: list[str], src: str, jetpack: str | None) -> dict[str, object]:
    row: dict[str, object] = {"target": target, "cuda": cuda, "jetpack": jetpack}
    # Orin's JetPack 7.2 line (CUDA 13.2) cross-builds; its default JetPack 6 line builds on the board.
    line = {"board_jetpack": jetpack, "board_cuda": "13.2" if jetpack == "7.2" else None} if jetpack else {}
    base = BuildOptions(target=target, cpu_only=not cuda, src=src, cuda_home="pypi" if cuda else None, **line)
    for mode in modes:
        if mode == "first":
            if Store().get(KIND, build_key(prepare(base))) is not None:
                raise SystemExit(f"{target}: the store has this build already; `first` measures a build "
                                 "nobody made yet (use --modes cold)")
            seconds, cached = timed(base, Store(), {})
        elif mode == "cached":
            build(base)  # make sure the real store has it, then time the skip
            seconds, cached = timed(base, Store(), {})
        else:
            # Beside the real build root, at the same depth: ccache (base_dir = the cache) then sees
            # the same relative paths as in a normal build and can hit.
            with tempfile.TemporaryDirectory(prefix=f"bench-{mode}-", dir=cache_dir()) as tmp:
                options = BuildOptions(**{**base.__dict__, "build_root": Path(tmp)})
                env = {"CCACHE_DISABLE": "1"} if mode == "cold" else {}
                seconds, cached = timed(options, Store(Path(tmp) / ".store"), env)
        row[mode] = round(seconds, 2)
        row[f"{mode}_skipped"] = cached
        print(f"{target}{' cuda' if cuda else ''} {mode}: {seconds:.1f} s", file=sys.stderr)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--targets", default="host,orin", help="comma-separated: host, orin, thor")
    parser.add_argument("--cuda", action="store_true", help="CUDA builds for orin/thor (wheel tree, slow)")
    parser.add_argument("--jetpack", help="the JetPack line of the boards (orin: 6 or 7.2)")
    parser.add_argument("--modes", default=",".join(MODES), help=f"comma-separated subset of {', '.join(MODES)}")
    parser.add_argument("--json", action="store_true", help="JSON instead of a table")
    args = parser.parse_args()
    modes = [m for m in args.modes.split(",") if m]
    if unknown := set(modes) - set(MODES):
        parser.error(f"unknown modes: {', '.join(sorted(unknown))}")
    src = str(fetch_sdist())
    targets = [t for t in args.targets.split(",") if t]
    rows = [measure(t, args.cuda and t != "host", modes, src, args.jetpack if t != "host" else None) for t in targets]
    if args.json:
        print(json.dumps({"cores": os.cpu_count(), "rows": rows}, indent=2))
        return
    print(f"{'target':<12}" + "".join(f"{m + ' (s)':>14}" for m in modes))
    for row in rows:
        name = f"{row['target']}{'-cuda' if row['cuda'] else '-cpu'}"
        print(f"{name:<12}" + "".join(f"{row[m]:>14}" for m in modes))


if __name__ == "__main__":
    main()
