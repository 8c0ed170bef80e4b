"""What a fleet rollout costs the workstation's uplink with sites: 1 and N boards on one site behind a capped link.

    sudo python benchmarks/fleet_bytes.py                       # 1 and 8 boards, 20 Mbit/s uplink
    sudo python benchmarks/fleet_bytes.py --sizes 1,4,8 --rate 50
    sudo python benchmarks/fleet_bytes.py --sizes 1 --faults 4   # then the faults on a site of 4

Fresh simulated boards (empty stores), each in a network namespace of its own on one bridge (the site's LAN),
all behind one uplink whose way in is capped with tbf (`edgekit.sim.netns.site`; the uplink's veth counts the
bytes): the seed takes the release over the uplink, the others from the seed over the bridge, with the boards'
own nginx and aria2c, pulled in the playbook's batches. Per size: the bytes the workstation sent over the
uplink ÷ (N × the release) — goal ≈ 1/N — and the whole `edgekit fleet rollout` (probe, plan, seed, the
playbook's pulls, activation and health) against one board's — goal ≤ 1.5× at N = 8. The ratio covers the whole
command; the boards' activation runs on this machine's 2 cores (a real site activates on each board's own).
With ``--faults N``: a site of N boards takes a release, then four more, each after its boards lost the model
blob from their stores (as new boards would lack it): one with no fault (the baseline of the others), then each
with one fault: a byte flipped in the seed's stored copy (hashed again before it serves: sent anew), the seed's
nginx killed the moment it starts (the first batch's pulls find nobody and the workstation sends them their
blobs; later batches pull from them), the uplink dropped for 8 s in the middle of the seed's push and restored
(the push resumes). Per fault: the uplink's bytes ÷ the release, the wall time against the no-fault one's, and
whether every board then serves a checked release with every blob holding its bytes.
Prints JSON, then tables. Needs root (namespaces), nginx and aria2c.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import simenv  # benchmarks/simenv.py
import yaml

from edgekit.config.boardfile import Boards
from edgekit.resources import builtin_recipes_dir
from edgekit.sim import boards as sim
from edgekit.sim import faults, netns
from edgekit.sim.link import route_to
from edgekit.sim.testing import SimBoard


def one_size(n: int, rate: float, env: dict[str, str], targets: sim.Targets, sim_dir: Path, k: int,
             with_faults: bool = False) -> dict[str, Any]:
    st, created, _ = sim.up(sim_dir, n, "orin", targets)
    board_file = Boards(targets.board_file)
    with contextlib.ExitStack() as stack, netns.site(rate, boards=n, index=200 + k) as lan:
        up, names = lan.uplink, []
        for i, name in enumerate(created):
            board = st.boards[name]
            host, port = stack.enter_context(netns.sshd_in(lan, i, board.sshd_config, board.path / "sshd-site.log"))
            names.append(route_to(targets.board_file, targets.known_hosts, name, host, port, site=f"site{k}",
                                  site_host=host))
        data = board_file.load()
        data.groups[f"size{k}"] = names
        board_file.save(data)
        report, wall, sent = rollout(env, up, "sim-tiny-mtp", f"size{k}")
        site = (report.get("sites") or {}).get(f"site{k}")
        release = site["workstation_bytes"] if site else None  # one board is no site: the playbook sends it all
        row = {"boards": n, "release_bytes": release, "uplink_bytes": sent, "wall_s": round(wall, 2),
               "pulls_s": {m: r.get("seconds") for m, r in (site or {}).get("boards", {}).items()},
               "site": site, "succeeded": len(report.get("succeeded") or [])}
        if with_faults:
            boards = [SimBoard.from_state(st, st.boards[name], targets.known_hosts) for name in created]
            row["faults"] = run_faults(env, lan, boards, f"size{k}", f"site{k}", release or sent, sim_dir)
    return row


def rollout(env: dict[str, str], up: netns.Uplink, recipe: str, group: str) -> tuple[dict[str, Any], float, int]:
    before, t0 = up.tx_bytes(), time.monotonic()
    res = subprocess.run([sys.executable, "-m", "edgekit", "--json", "fleet", "rollout", "--recipe", recipe,
                          "--group", group, "--no-canary"], env=env, capture_output=True, text=True, timeout=3600)
    wall, sent = time.monotonic() - t0, up.tx_bytes() - before
    if res.returncode != 0:
        raise SystemExit(f"rollout of {recipe} to {group} failed: {res.stderr[-2000:]}")
    return json.loads(res.stdout), wall, sent


def _variant(work: Path, n: int) -> str:
    """sim-tiny-mtp with another draft_n_max: a new release of the same models."""
    data = yaml.safe_load((builtin_recipes_dir() / "sim-tiny-mtp.yaml").read_text())
    data["runtime"]["draft_n_max"] = n
    path = work / f"variant-{n}.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def _model(board: SimBoard) -> str:
    rid = os.readlink(board.base / "current").removeprefix("releases/")
    files = json.loads((board.base / "releases" / rid / "release.json").read_text())["files"]
    return max(files.values(), key=lambda f: f["size"])["sha256"]


@contextlib.contextmanager
def _killing_nginx_of(board: SimBoard) -> Any:
    """The board's nginx (master and workers) killed the moment it starts, for as long as this lasts."""
    stop = threading.Event()

    def kill() -> None:
        while not stop.is_set():
            for p in psutil.process_iter(["name", "cmdline"]):
                with contextlib.suppress(psutil.Error, ProcessLookupError):
                    if p.info["name"] == "nginx" and f"{board.base}/site/" in " ".join(p.info["cmdline"] or []):
                        os.killpg(os.getpgid(p.pid), signal.SIGKILL)
            time.sleep(0.01)

    thread = threading.Thread(target=kill, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(5)


@contextlib.contextmanager
def _uplink_drop_after(up: netns.Uplink, after_bytes: int, seconds: float) -> Any:
    """The uplink dropped once ``after_bytes`` more crossed it, restored ``seconds`` later; yields what happened."""
    start, stop, seen = up.tx_bytes(), threading.Event(), {"dropped_after_bytes": None}

    def drop() -> None:
        while not stop.is_set() and up.tx_bytes() - start < after_bytes:
            time.sleep(0.05)
        if not stop.is_set():
            seen["dropped_after_bytes"] = up.tx_bytes() - start
            up.cut(True)
            time.sleep(seconds)
            up.cut(False)

    thread = threading.Thread(target=drop, daemon=True)
    thread.start()
    try:
        yield seen
    finally:
        stop.set()
        thread.join(seconds + 5)
        up.cut(False)


def run_faults(env: dict[str, str], lan: netns.SiteLan, boards: list[SimBoard], group: str, site_name: str,
               release: int, sim_dir: Path) -> list[dict[str, Any]]:
    up = lan.uplink
    seed, rest = boards[0], boards[1:]
    model = _model(seed)
    model_size = (seed.base / "store" / model).stat().st_size
    work = sim_dir.parent
    rows = []

    def lose(which: list[SimBoard]) -> None:
        for b in which:
            with contextlib.suppress(FileNotFoundError):
                (b.base / "store" / model).unlink()

    def nothing() -> contextlib.AbstractContextManager[Any]:
        lose(rest)
        return contextlib.nullcontext()

    def flipped() -> contextlib.AbstractContextManager[Any]:
        lose(rest)
        stored = seed.base / "store" / model
        data = bytearray(stored.read_bytes())
        data[4096] ^= 0xFF
        (seed.base / "store" / f"{model}.bad").write_bytes(bytes(data))
        os.replace(seed.base / "store" / f"{model}.bad", stored)
        return contextlib.nullcontext()

    def killed() -> contextlib.AbstractContextManager[Any]:
        lose(rest)
        return _killing_nginx_of(seed)

    def dropped() -> contextlib.AbstractContextManager[Any]:
        lose(boards)
        return _uplink_drop_after(up, model_size // 3, 8.0)

    clean = 0.0
    for n, (name, fault) in enumerate((("none (the neighbours lack the model)", nothing),
                                       ("a byte flipped in the seed's stored copy", flipped),
                                       ("the seed's nginx killed as it starts", killed),
                                       ("the uplink dropped 8 s mid-push, restored", dropped)), start=1):
        with fault() as seen:
            report, wall, sent = rollout(env, up, _variant(work, 3 + n), group)  # 4..7: 3 is sim-tiny-mtp's own
        clean = wall if n == 1 else clean
        site = (report.get("sites") or {}).get(site_name) or {}
        wrong = {b.name: faults.violations(b, netns=lan.namespaces[i]) for i, b in enumerate(boards)}
        rows.append({"fault": name, "uplink_bytes": sent, "uplink_releases": round(sent / release, 2),
                     "wall_s": round(wall, 2), "wall_vs_clean": round(wall / clean, 2), **(seen or {}),
                     "all_correct": not any(wrong.values()) and len(report.get("succeeded") or []) == len(boards),
                     "seed": site.get("seed"), "notes": site.get("notes"),
                     "pulls": {m: {k: r.get(k) for k in ("bytes", "sources", "missing", "why")}
                               for m, r in (site.get("boards") or {}).items()},
                     "wrong": {k: v for k, v in wrong.items() if v}})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1,8")
    ap.add_argument("--rate", type=float, default=20.0, help="the uplink's cap, Mbit/s")
    ap.add_argument("--faults", type=int, default=0, metavar="N", help="then the faults on a site of N boards")
    args = ap.parse_args()
    if not netns.available() or not (shutil.which("nginx") or os.path.exists("/usr/sbin/nginx")) \
            or not shutil.which("aria2c"):
        raise SystemExit("needs root, iproute2, nginx and aria2c (.ci/install installs the last two)")
    sizes = [int(x) for x in args.sizes.split(",")]
    rows = []
    for k, n in enumerate([*sizes, *([args.faults] if args.faults else [])]):
        work, env, targets = simenv.isolated(f"edgekit-fleet-bytes-{n}-")
        try:
            rows.append(one_size(n, args.rate, env, targets, work / "sim", k, with_faults=k >= len(sizes)))
        finally:
            sim.down(work / "sim", purge=True)
            shutil.rmtree(work, ignore_errors=True)
    fault_rows = rows.pop()["faults"] if args.faults else []
    one = next((r for r in rows if r["boards"] == 1), rows[0])
    release = max(r["release_bytes"] or 0 for r in rows) or one["uplink_bytes"]
    for r in rows:
        r["uplink_per_board_release"] = round(r["uplink_bytes"] / (r["boards"] * release), 3)
        r["wall_vs_one"] = round(r["wall_s"] / one["wall_s"], 2)
    print(json.dumps({"benchmark": "fleet_bytes", "rate_mbit": args.rate, "cores": os.cpu_count(),
                      "release_bytes": release, "rows": rows, "faults": fault_rows}, indent=1))
    print(f"\nrelease {release / 1e6:.1f} MB, uplink {args.rate:g} Mbit/s\n")
    print(f"{'boards':>6} {'uplink MB':>10} {'÷ N×release':>12} {'wall s':>7} {'÷ one':>6} {'slowest pull s':>15}")
    for r in rows:
        slowest = max((s or 0 for s in r["pulls_s"].values()), default=0)
        print(f"{r['boards']:>6} {r['uplink_bytes'] / 1e6:>10.1f} {r['uplink_per_board_release']:>12.3f} "
              f"{r['wall_s']:>7.1f} {r['wall_vs_one']:>6.2f} {slowest:>15.2f}")

    if fault_rows:
        print(f"\nfaults on a site of {args.faults} (each after the boards lost the model blob)\n")
        print(f"{'fault':<44} {'uplink ÷ release':>16} {'wall s':>7} {'÷ clean':>8} {'all correct':>12}")
        for f in fault_rows:
            print(f"{f['fault']:<44} {f['uplink_releases']:>16.2f} {f['wall_s']:>7.1f} {f['wall_vs_clean']:>8.2f} "
                  f"{'yes' if f['all_correct'] else 'NO':>12}")


if __name__ == "__main__":
    main()
