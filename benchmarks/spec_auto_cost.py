"""What `runtime.spec: auto` adds to a deploy: the same recipe deployed with `spec: on` and with `spec: auto`,
side by side on one simulated board.

    python benchmarks/spec_auto_cost.py              # 3 rounds, sim-tiny-mtp
    python benchmarks/spec_auto_cost.py --rounds 5

Each round deploys the `on` variant, then the `auto` variant (`--remeasure`, so it measures every time), then
the other order in the next round; each deploy activates a release the board does not serve at that moment,
so both pay the same push-nothing, activate, health path. The `auto` deploy adds the on-board A/B (the
service stopped meanwhile, alternating drafter and target alone until the CI95 of the gain clears the bar,
3 to 8 pairs) and, where the drafter loses, a second activation of the target alone. The ratio is the `auto`
deploy's wall time over the `on` deploy's, as `edgekit deploy` reports it (probe to healthy, end to end);
it says nothing of a Jetson, where a pair runs n_gen × requests tokens per configuration at the board's speed.
Prints JSON first, then a table.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
from pathlib import Path
from typing import Any

import simenv  # benchmarks/simenv.py
import yaml
from simenv import edgekit

from edgekit.resources import builtin_recipes_dir
from edgekit.sim import boards as sim


def variant(work: Path, of: str, spec: str) -> Path:
    data = yaml.safe_load((builtin_recipes_dir() / f"{of}.yaml").read_text())
    data["name"] = f"{of}-{spec}"
    data["runtime"]["spec"] = spec
    path = work / f"{data['name']}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--recipe", default="sim-tiny-mtp", help="a built-in recipe with a drafter")
    args = ap.parse_args()
    work, env, targets = simenv.isolated("edgekit-spec-auto-bench-")
    seconds: dict[str, list[float]] = {"on": [], "auto": []}
    ab: list[dict[str, Any]] = []
    try:
        _, (board,), _ = sim.up(work / "sim", 1, "orin", targets)
        recipes = {spec: variant(work, args.recipe, spec) for spec in ("on", "auto")}
        edgekit(env, "deploy", "--board", board, "--recipe", str(recipes["on"]))  # builds and pushes, once
        edgekit(env, "deploy", "--board", board, "--recipe", str(recipes["auto"]))
        for i in range(args.rounds):
            for spec in (("on", "auto") if i % 2 == 0 else ("auto", "on")):
                extra = ["--remeasure"] if spec == "auto" else []
                report = edgekit(env, "deploy", "--board", board, "--recipe", str(recipes[spec]), *extra)
                seconds[spec].append(report["seconds"])
                if spec == "auto":
                    s = report["spec_auto"]
                    ab.append({"serve": s["serve"], "pairs": s["pairs"], "ab_seconds": s["seconds"],
                               "gain": s["gain"]["mean"] if s.get("gain") else None})
    finally:
        sim.down(work / "sim", purge=True)
        shutil.rmtree(work, ignore_errors=True)
    med = {k: round(statistics.median(v), 2) for k, v in seconds.items()}
    ratio = round(med["auto"] / med["on"], 2)
    ab_s = statistics.median(a["ab_seconds"] for a in ab)
    headline = (f"spec auto / spec on deploy time: {ratio:.2f}x ({med['auto']:.1f} s against {med['on']:.1f} s, "
                f"+{med['auto'] - med['on']:.1f} s; the A/B alone {ab_s:.1f} s)")
    print(json.dumps({"benchmark": "spec_auto_cost", "headline": headline, "cores": os.cpu_count(),
                      "recipe": args.recipe, "rounds": args.rounds, "seconds": seconds, "median_s": med,
                      "ratio": ratio, "ab": ab}, indent=2))
    print(f"\n{headline}\n")
    print(f"{'round':>5} {'on s':>7} {'auto s':>7} {'A/B s':>6} {'pairs':>5} {'gain':>6}  served")
    for i, a in enumerate(ab):
        print(f"{i + 1:>5} {seconds['on'][i]:>7.1f} {seconds['auto'][i]:>7.1f} {a['ab_seconds']:>6.1f} {a['pairs']:>5} "
              f"{a['gain'] or 0:>5.2f}x  {a['serve']}")


if __name__ == "__main__":
    main()
