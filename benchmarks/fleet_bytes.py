"""What a fleet rollout costs the workstation's uplink with sites: 1 and N boards on one site behind a capped link.

    sudo python benchmarks/fleet_bytes.py                       # 1 and 8 boards, 20 Mbit/s uplink
    sudo python benchmarks/fleet_bytes.py --sizes 1,4,8 --rate 50

Fresh simulated boards (empty stores), every one reached from the workstation through one network namespace
whose way in is capped with tbf (`edgekit.sim.netns`: the site's uplink; its veth counts the bytes), all in one
site: the seed takes the release over the uplink, the others from the seed over the site's network (this
machine's loopback), with the boards' own nginx and aria2c. Per size: the bytes the workstation sent over the
uplink ÷ (N × the release) — goal ≈ 1/N — and the whole `edgekit fleet rollout` (probe, plan, seed, pulls, the
playbook's activation and health) against one board's — goal ≤ 1.5× at N = 8. The ratio covers the whole
command; the boards' activation runs on this machine's 2 cores (a real site activates on each board's own).
The pulls' faults (a poisoned copy, a seed gone mid-blob) are tests/test_sites.py's. Prints JSON, then a table.
Needs root (namespaces), nginx and aria2c.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import simenv  # benchmarks/simenv.py

from edgekit.config.boardfile import Boards
from edgekit.sim import boards as sim
from edgekit.sim import netns
from edgekit.sim.link import route_to


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def one_size(n: int, rate: float, env: dict[str, str], targets: sim.Targets, sim_dir: Path, k: int) -> dict[str, Any]:
    _, created, _ = sim.up(sim_dir, n, "orin", targets)
    board_file = Boards(targets.board_file)
    with contextlib.ExitStack() as stack, netns.uplink(rate, index=200 + k) as up:
        names = []
        for i, name in enumerate(created):
            entry = board_file.load().boards[name]
            host, port = stack.enter_context(netns.board_behind(up, entry.port, inner_port=2400 + i))
            names.append(route_to(targets.board_file, targets.known_hosts, name, host, port, site=f"site{k}",
                                  site_host="127.0.0.1", site_port=free_port()))
        data = board_file.load()
        data.groups[f"size{k}"] = names
        board_file.save(data)
        before, t0 = up.tx_bytes(), time.monotonic()
        res = subprocess.run([sys.executable, "-m", "edgekit", "--json", "fleet", "rollout", "--recipe", "sim-tiny-mtp",
                              "--group", f"size{k}", "--no-canary"], env=env, capture_output=True, text=True,
                             timeout=3600)
        wall, sent = time.monotonic() - t0, up.tx_bytes() - before
    if res.returncode != 0:
        raise SystemExit(f"rollout to {n} board(s) failed: {res.stderr[-2000:]}")
    report = json.loads(res.stdout)
    site = (report.get("sites") or {}).get(f"site{k}")
    release = site["workstation_bytes"] if site else None  # one board is no site: the playbook sends it all
    return {"boards": n, "release_bytes": release, "uplink_bytes": sent, "wall_s": round(wall, 2),
            "pulls_s": {m: r.get("seconds") for m, r in (site or {}).get("boards", {}).items()},
            "site": site, "succeeded": len(report.get("succeeded") or [])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1,8")
    ap.add_argument("--rate", type=float, default=20.0, help="the uplink's cap, Mbit/s")
    args = ap.parse_args()
    if not netns.available() or not (shutil.which("nginx") or os.path.exists("/usr/sbin/nginx")) \
            or not shutil.which("aria2c"):
        raise SystemExit("needs root, iproute2, nginx and aria2c (.ci/install installs the last two)")
    sizes = [int(x) for x in args.sizes.split(",")]
    rows = []
    for k, n in enumerate(sizes):
        work, env, targets = simenv.isolated(f"edgekit-fleet-bytes-{n}-")
        try:
            rows.append(one_size(n, args.rate, env, targets, work / "sim", k))
        finally:
            sim.down(work / "sim", purge=True)
            shutil.rmtree(work, ignore_errors=True)
    one = next((r for r in rows if r["boards"] == 1), rows[0])
    release = max(r["release_bytes"] or 0 for r in rows) or one["uplink_bytes"]
    for r in rows:
        r["uplink_per_board_release"] = round(r["uplink_bytes"] / (r["boards"] * release), 3)
        r["wall_vs_one"] = round(r["wall_s"] / one["wall_s"], 2)
    print(json.dumps({"benchmark": "fleet_bytes", "rate_mbit": args.rate, "cores": os.cpu_count(),
                      "release_bytes": release, "rows": rows}, indent=1))
    print(f"\nrelease {release / 1e6:.1f} MB, uplink {args.rate:g} Mbit/s\n")
    print(f"{'boards':>6} {'uplink MB':>10} {'÷ N×release':>12} {'wall s':>7} {'÷ one':>6} {'slowest pull s':>15}")
    for r in rows:
        slowest = max((s or 0 for s in r["pulls_s"].values()), default=0)
        print(f"{r['boards']:>6} {r['uplink_bytes'] / 1e6:>10.1f} {r['uplink_per_board_release']:>12.3f} "
              f"{r['wall_s']:>7.1f} {r['wall_vs_one']:>6.2f} {slowest:>15.2f}")


if __name__ == "__main__":
    main()
