"""Push goodput on a rate-limited link: how much of a link's rate edgekit's push turns into verified blob bytes.

    sudo python benchmarks/link_rate.py --rates 20,100 --size-mib 64 --out DIR

A simulated board behind a veth pair into a network namespace whose way in is capped with tbf (edgekit.sim.netns;
netem is not in this kernel). For each rate, one fresh blob is pushed by each of edgekit's two paths — the OpenSSH
stream (blobs of 16 MiB and more) and SFTP with the board hashing as it arrives (smaller blobs, or `verify:
stream`) — and the ratio is blob bytes per second over the link's rate. What the ratio includes: the whole push
(inventory, upload, the board's sha256 and fsync, the rename; not the SSH connection opened before it, one key
exchange that `edgekit push` pays too), SSH's framing and TCP/IP headers on the link; the
goal is ≥ 0.90. JSON first (also DIR/link_rate.json), then a Markdown table (DIR/link_rate.md). Root only.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import simenv  # benchmarks/simenv.py
from rich.console import Console

from edgekit.config.boardfile import Boards
from edgekit.remote.runner import SshRunner
from edgekit.remote.transfer import Blob, push_blobs
from edgekit.sim import boards as sim
from edgekit.sim import netns
from edgekit.sim.link import route_to
from edgekit.sim.testing import SimBoard

GOAL = 0.90


def fresh_blob(work: Path, size: int, tag: str) -> Blob:
    path = work / f"blob-{tag}"
    digest = hashlib.sha256()
    with open(path, "wb") as fh:
        left = size
        while left:
            chunk = os.urandom(min(left, 1 << 20))  # random: nothing on the way can compress it
            fh.write(chunk)
            digest.update(chunk)
            left -= len(chunk)
    return Blob(digest.hexdigest(), size, path)


def measure(work: Path, env: dict[str, str], targets: sim.Targets, board: SimBoard, rate: float, size: int,
            index: int) -> list[dict[str, Any]]:
    rows = []
    with netns.uplink(rate, index=index) as up, netns.board_behind(up, board.port) as (host, port):
        name = route_to(targets.board_file, targets.known_hosts, board.name, host, port)
        entry = Boards(targets.board_file).load().boards[name]
        for path_name, verify in (("openssh", "openssh"), ("sftp", "stream")):
            blob = fresh_blob(work, size, f"{rate}-{path_name}")
            before = up.tx_bytes()
            with SshRunner(entry, name) as runner:
                report = push_blobs(runner, str(board.base), [blob], verify=verify)  # type: ignore[arg-type]
            on_link = up.tx_bytes() - before
            goodput = size * 8 / report.seconds / 1e6
            rows.append({"rate_mbit": rate, "path": path_name, "bytes": size, "seconds": report.seconds,
                         "goodput_mbit": round(goodput, 2), "ratio": round(goodput / rate, 3),
                         "link_bytes": on_link, "overhead": round(on_link / size - 1, 4)})
            blob.path.unlink()
    return rows


def markdown(doc: dict[str, Any]) -> str:
    lines = [f"# Push goodput on a tbf-capped link ({doc['size_mib']} MiB of random bytes per push)", "",
             "| link rate | path | seconds | goodput | ratio (goal ≥ 0.90) | bytes on the link over blob bytes |",
             "| --- | --- | --- | --- | --- | --- |"]
    for r in doc["rows"]:
        lines.append(f"| {r['rate_mbit']:g} Mbit/s | {r['path']} | {r['seconds']:.2f} | {r['goodput_mbit']:.1f} "
                     f"Mbit/s | **{r['ratio']:.3f}** | +{r['overhead'] * 100:.1f} % |")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rates", default="20,100", help="link rates in Mbit/s, comma-separated")
    ap.add_argument("--size-mib", type=int, default=64)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    if not netns.available():
        print("link_rate.py needs root and iproute2 (network namespaces, veth, tbf).", file=sys.stderr)
        return 2
    work, env, targets = simenv.isolated("edgekit-link-rate-")
    os.environ.update(env)  # this process pushes itself: the throwaway config's known_hosts
    sim_dir = work / "sim"
    rows: list[dict[str, Any]] = []
    console = Console(stderr=True)
    try:
        st, created, _ = sim.up(sim_dir, 1, "orin", targets)
        board = SimBoard.from_state(st, st.boards[created[0]], targets.known_hosts)
        for i, rate in enumerate(float(r) for r in args.rates.split(",")):
            with console.status(f"pushing {args.size_mib} MiB twice over a {rate:g} Mbit/s link"):
                rows += measure(work, env, targets, board, rate, args.size_mib << 20, index=200 + i)
    finally:
        sim.down(sim_dir)
        shutil.rmtree(work, ignore_errors=True)
    doc = {"size_mib": args.size_mib, "goal": GOAL, "rows": rows}
    print(json.dumps(doc, indent=1))
    print(markdown(doc))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "link_rate.json").write_text(json.dumps(doc, indent=1))
        (args.out / "link_rate.md").write_text(markdown(doc))
    return 0 if all(r["ratio"] >= GOAL for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
