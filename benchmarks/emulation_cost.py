"""What emulation costs: the tiny pair on an emulated aarch64 Orin vs an x86 sim Orin, one run, side by side.

    python benchmarks/emulation_cost.py            # deploy sim-tiny-mtp to both, `bench --quick` each, 2 rounds
    python benchmarks/emulation_cost.py --rounds 3

Both boards are sim boards on this machine: the x86 one runs the host build natively, the emulated
one the aarch64 release a Jetson gets, under qemu-user. The ratio is emulated / native for the same
recipe, prompts and settings, measured alternately (x86, emulated, x86, …) so drift hits both; it
includes everything a request pays (HTTP over SSH, tokenisation, prompt, decode, drafting). It says
what qemu costs here and **nothing about a Jetson**: a real Orin runs these binaries natively, on
its GPU. Prints JSON first, then a table.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
from typing import Any

import simenv  # benchmarks/simenv.py
from simenv import edgekit

from edgekit.sim import boards as sim


def figures(doc: dict[str, Any]) -> dict[str, float]:
    """Median tok/s and TTFT per configuration (baseline, drafter) over the bench's c=1 runs."""
    out: dict[str, float] = {}
    for config in ("baseline", "drafter"):
        runs = [r for r in doc["runs"] if r["config"] == config and r["concurrency"] == 1]
        out[f"{config}_tok_s"] = statistics.median(r["tokens_per_second"] for r in runs)
        out[f"{config}_ttft_s"] = statistics.median(r["ttft_p50_s"] for r in runs)
    out["acceptance"] = doc["summary"]["headline"]["acceptance"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=2, help="bench rounds per board, alternating")
    args = ap.parse_args()
    work, env, targets = simenv.isolated("edgekit-emulation-bench-")
    per: dict[str, list[dict[str, float]]] = {"x86_64": [], "aarch64": []}
    deploys: dict[str, Any] = {}
    try:
        _, native, _ = sim.up(work / "sim", 1, "orin", targets)
        _, emulated, _ = sim.up(work / "sim", 1, "orin", targets, arch="aarch64")
        names = {"x86_64": native[0], "aarch64": emulated[0]}
        for arch, name in names.items():
            report = edgekit(env, "deploy", "--board", name, "--recipe", "sim-tiny-mtp")
            deploys[arch] = {"build": report["build"]["target"], "health_tok_s": report["health"]["tokens_per_second"]}
        for i in range(args.rounds):
            for arch in (("x86_64", "aarch64") if i % 2 == 0 else ("aarch64", "x86_64")):
                doc = edgekit(env, "bench", "--board", names[arch], "--recipe", "sim-tiny-mtp", "--quick",
                              "--out", str(work / f"bench-{arch}-{i}"))
                per[arch].append(figures(doc))
    finally:
        sim.down(work / "sim", purge=True)
        shutil.rmtree(work, ignore_errors=True)
    med = {arch: {k: round(statistics.median(r[k] for r in rows), 4) for k in rows[0]} for arch, rows in per.items()}
    ratios = {k: round(med["aarch64"][k] / med["x86_64"][k], 3) for k in med["x86_64"] if med["x86_64"][k]}
    headline = (f"emulated aarch64 / native x86 tok/s: {ratios['baseline_tok_s']:.2f}x without the drafter, "
                f"{ratios['drafter_tok_s']:.2f}x with it (end to end per request; qemu's cost, not a Jetson figure)")
    print(json.dumps({"benchmark": "emulation_cost", "headline": headline, "cores": os.cpu_count(),
                      "rounds": args.rounds, "deploys": deploys, "median": med, "ratios": ratios}, indent=2))
    print(f"\n{headline}\n")
    print(f"{'board':<10} {'build':<10} {'base tok/s':>11} {'mtp tok/s':>10} {'base TTFT':>10} {'mtp TTFT':>9} "
          f"{'acc':>5}")
    for arch, m in med.items():
        print(f"{arch:<10} {deploys[arch]['build']:<10} {m['baseline_tok_s']:>11.1f} {m['drafter_tok_s']:>10.1f} "
              f"{m['baseline_ttft_s']:>10.3f} {m['drafter_ttft_s']:>9.3f} {m['acceptance']:>5.2f}")


if __name__ == "__main__":
    main()
