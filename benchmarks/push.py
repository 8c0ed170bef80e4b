"""Measure `push_blobs` against scp and rsync on loopback sshd boards; ratios in one run.

    python benchmarks/push.py                    # 1 GiB, 3 repeats, 8 boards (a few minutes)
    python benchmarks/push.py --size-mib 128 --repeat 1   # a quick look

Prints JSON first, then a table. Every board is a simulated board (edgekit.sim: a real sshd on
127.0.0.1 with its own pinned host key), so both ends of every connection share this machine's
CPUs: fan-out to several boards is bounded by the cores here, not by a network.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from edgekit.config.boardfile import Board
from edgekit.remote.runner import SshRunner
from edgekit.remote.transfer import Blob, PushReport, push_blobs, push_many
from edgekit.sim import boards as sim
from edgekit.sim.testing import SimBoard

MiB = 1 << 20


class BenchBoard:
    """A simulated board (edgekit.sim: real sshd on 127.0.0.1, pinned host key) as the benchmark uses it."""

    def __init__(self, sb: SimBoard) -> None:
        self.name, self.port, self.user, self.base = sb.name, sb.port, sb.user, sb.base
        self.key, self.known_hosts, self.profile = sb.key, sb.known_hosts, sb.profile

    def board(self) -> Board:
        return Board(host="127.0.0.1", port=self.port, user=self.user, key=str(self.key), profile=self.profile,
                     base=str(self.base), known_hosts=str(self.known_hosts))

    def ssh_opts(self) -> list[str]:
        return ["-i", str(self.key), "-o", f"UserKnownHostsFile={self.known_hosts}",
                "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes"]

    def clear(self) -> None:
        shutil.rmtree(self.base, ignore_errors=True)
        self.base.mkdir()
        # Settle the disk: the freed blocks of the last run's copy (discarded at the next journal commit) are
        # that run's cost, not a cost of the next run's final fsync.
        os.sync()


def start_boards(work: Path, n: int) -> list[BenchBoard]:
    targets = sim.Targets(work / "edgekit.yaml", work / "known_hosts")
    st, _, _ = sim.up(work / "sim", n, "orin", targets)
    return [BenchBoard(SimBoard.from_state(st, b, targets.known_hosts)) for b in sim.sorted_boards(st)[:n]]


def make_payload(path: Path, size: int) -> Blob:
    digest = hashlib.sha256()
    with open(path, "wb") as fh:
        left = size
        while left:
            chunk = os.urandom(min(left, 16 * MiB))
            fh.write(chunk)
            digest.update(chunk)
            left -= len(chunk)
    return Blob(digest.hexdigest(), size, path)


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def median_of(repeat: int, prepare: Callable[[], None], fn: Callable[[], Any]) -> tuple[float, list[float], Any]:
    times, out = [], None
    for _ in range(repeat):
        prepare()
        t, out = timed(fn)
        times.append(round(t, 3))
    return statistics.median(times), times, out


def edgekit_push(board: BenchBoard, blobs: list[Blob], verify: str = "auto") -> PushReport:
    """What `edgekit push` does for one board: connect (strict host key), then push."""
    with SshRunner(board.board(), board.name) as runner:
        return push_blobs(runner, str(board.base), blobs, verify=verify)  # type: ignore[arg-type]


def fleet_push(boards: list[BenchBoard], blobs: list[Blob]) -> dict[str, Any]:
    with ThreadPoolExecutor(len(boards)) as pool:  # connect in parallel too, as a fleet push would
        runners = list(pool.map(lambda b: SshRunner(b.board(), b.name), boards))
    try:
        results = push_many([(r, str(b.base)) for r, b in zip(runners, boards, strict=True)], blobs)
    finally:
        for r in runners:
            r.close()
    if results.failed:
        raise RuntimeError(f"fleet push failed: {results.failed}")
    return dict(results)


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    boards = start_boards(work, max(args.fleet, 1))
    one = boards[0]
    try:
        size = args.size_mib * MiB
        payload = make_payload(work / "payload.bin", size)
        mb = size / 1e6
        res: dict[str, Any] = {"size_bytes": size, "repeat": args.repeat, "cpus": os.cpu_count(),
                               "boards": len(boards)}
        dest = one.base / "copy.bin"

        def scp() -> None:
            subprocess.run(["scp", "-q", "-P", str(one.port), *one.ssh_opts(), str(payload.path),
                            f"{one.user}@127.0.0.1:{dest}"], check=True)

        def rsync() -> None:
            ssh = shlex.join(["ssh", "-p", str(one.port), *one.ssh_opts()])
            subprocess.run(["rsync", "-e", ssh, str(payload.path), f"{one.user}@127.0.0.1:{dest}"], check=True)

        rows: list[tuple[str, float, list[float], str]] = []

        def push_stream() -> None:
            assert edgekit_push(one, [payload]).sent_bytes == size

        def push_after() -> None:
            assert edgekit_push(one, [payload], "after").sent_bytes == size

        def push_sftp() -> None:
            assert edgekit_push(one, [payload], "stream").sent_bytes == size

        fresh = [("scp", "scp", scp), ("rsync", "rsync -e ssh", rsync), ("push", "edgekit push", push_stream),
                 ("push_sftp", "edgekit push by paramiko SFTP (fallback)", push_sftp),
                 ("push_verify_after", "edgekit push, SFTP, hash after upload", push_after)]
        fresh = [f for f in fresh if f[0] not in ("scp", "rsync") or shutil.which(f[0])]
        runs: dict[str, list[float]] = {key: [] for key, _, _ in fresh}
        for _ in range(args.repeat):  # interleaved, so a load change on the machine hits all alike
            for key, _, fn in fresh:
                one.clear()
                runs[key].append(round(timed(fn)[0], 3))
        for key, label, _ in fresh:
            t = statistics.median(runs[key])
            res[key] = {"seconds": t, "runs": runs[key], "MBps": round(mb / t, 1)}
            rows.append((f"{label} (fresh, incl. connect)", t, runs[key], ""))
        res["push"]["verify"] = "auto: the OpenSSH client, hashed on the board as the bytes land"

        t, ts, rep = median_of(5, lambda: None, lambda: edgekit_push(one, [payload]))
        assert rep.sent_bytes == 0 and rep.skipped_blobs == 1
        res["noop"] = {"seconds": t, "runs": ts, "push_seconds": rep.seconds}
        rows.append(("edgekit push, nothing to send", t, ts, f"push part {rep.seconds:.3f} s"))

        def cut_at_half() -> None:
            one.clear()
            (one.base / "store").mkdir()
            with open(payload.path, "rb") as src, open(one.base / "store" / f"{payload.sha256}.part", "wb") as dst:
                dst.write(src.read(size // 2))

        t, ts, rep = median_of(args.repeat, cut_at_half, lambda: edgekit_push(one, [payload]))
        res["resume_half"] = {"seconds": t, "runs": ts, "sent_bytes": rep.sent_bytes,
                              "resumed_bytes": rep.resumed_bytes,
                              "sent_over_remainder": round(rep.sent_bytes / (size - size // 2), 4)}
        rows.append(("edgekit push, resume after a cut at 50%", t, ts,
                     f"sent {rep.sent_bytes / 1e6:.0f} MB = {res['resume_half']['sent_over_remainder']}× remainder"))

        if args.fleet > 1:
            res["fleet"] = {}
            for label, fsize in (("small", args.fleet_small_kib * 1024), ("large", args.fleet_mib * MiB)):
                fblob = make_payload(work / f"fleet-{label}.bin", fsize)

                def clear_all() -> None:
                    for b in boards:
                        b.clear()

                t1, ts1, _ = median_of(args.repeat, clear_all, lambda fb=fblob: fleet_push(boards[:1], [fb]))
                tn, tsn, _ = median_of(args.repeat, clear_all, lambda fb=fblob: fleet_push(boards, [fb]))
                tnoop, tsnoop, _ = median_of(args.repeat, lambda: None, lambda fb=fblob: fleet_push(boards, [fb]))
                res["fleet"][label] = {"bytes_per_board": fsize, "one_board_s": t1, "n_boards_s": tn,
                                       "ratio": round(tn / t1, 2), "n_boards_noop_s": tnoop,
                                       "runs_one": ts1, "runs_n": tsn, "runs_noop": tsnoop}
                rows.append((f"{len(boards)} boards vs 1, {fsize / 1e6:g} MB each", tn, tsn,
                             f"1 board {t1:.2f} s → {tn / t1:.2f}×; redeploy to all: {tnoop:.2f} s"))
        scp_t = res.get("scp", {}).get("seconds")
        one_stream = scp_t / size if scp_t else None  # seconds per byte of one scp stream
        fanout = {k: round(v["n_boards_s"] / (one_stream * v["bytes_per_board"] * len(boards)), 2)
                  for k, v in res.get("fleet", {}).items()} if one_stream else {}
        res["headline"] = {
            "push_vs_scp_speed": round(scp_t / res["push"]["seconds"], 2) if scp_t else None,
            "says": (f"a fresh {mb:.0f} MB push is {scp_t / res['push']['seconds']:.2f}x scp's speed"
                     if scp_t else "no scp here"),
            "includes": "both from process/connection start to a complete file; edgekit also hashes every byte on "
                        "the board, renames atomically and reports; the fan-out figure is the 8-board wall time "
                        "over one scp stream of the same bytes (the byte limit here)",
            "fanout_vs_one_stream_limit": fanout,
        }
        res["ratios"] = {
            "push_vs_scp_speed": round(scp_t / res["push"]["seconds"], 2) if scp_t else None,
            "push_vs_rsync_speed": (round(res["rsync"]["seconds"] / res["push"]["seconds"], 2)
                                    if "rsync" in res else None),
            "resume_sent_over_remainder": res["resume_half"]["sent_over_remainder"],
            **{f"fleet_{k}_{len(boards)}_vs_1": v["ratio"] for k, v in res.get("fleet", {}).items()},
        }
        res["_rows"] = [(n, t, ts, note, round(scp_t / t, 2) if scp_t and n.endswith("connect)") else None)
                        for n, t, ts, note in rows]
        return res
    finally:
        sim.down(work / "sim")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mib", type=int, default=1024, help="the artifact pushed to one board (default 1024)")
    ap.add_argument("--repeat", type=int, default=3, help="runs per figure; medians are reported")
    ap.add_argument("--fleet", type=int, default=8, help="boards for the fan-out figure (default 8)")
    ap.add_argument("--fleet-mib", type=int, default=64, help="bandwidth-bound fan-out payload per board")
    ap.add_argument("--fleet-small-kib", type=int, default=1024, help="overhead-bound fan-out payload per board")
    ap.add_argument("--workdir", type=Path, default=None, help="default: a temporary directory, removed after")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="edgekit-push-bench-", dir=args.workdir))
    try:
        res = run(args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    rows = res.pop("_rows")
    head = res["headline"]
    print(f"{head['says']}; fan-out vs the one-stream byte limit: {head['fanout_vs_one_stream_limit']}; includes "
          f"{head['includes']}")
    print(json.dumps(res, indent=2))
    print()
    print(f"{'measurement':<44} {'median s':>9} {'× scp':>6}  runs / notes")
    for name, t, ts, note, vs in rows:
        print(f"{name:<44} {t:>9.3f} {vs if vs is not None else '':>6}  {ts} {note}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
