"""Sites: a rollout costs the workstation one release per site, not one per board.

Boards that reach each other cheaply share a ``site`` in the board file. Before the playbook runs, per site:

1. **Seed.** The site's blobs (every member's release) go once to one board — the canary where it is in the site,
   else the first — over edgekit's verified, resumable SSH push. A seed that cannot take them hands the role to
   the next board; if none can, the site falls back to today's path.
2. **Serve.** The seed serves its blob store read-only with the board's own nginx (Range requests: a cut
   download resumes), on ``site_host:site_port``, to the site's boards' addresses only, for this rollout only.
3. **Pull**, in waves: each board runs ``agent site-pull`` (aria2c, several sources in order: the seed, then the
   boards that already finished and now serve too, so a seed that dies hands over). The manifest of hashes comes
   from the workstation over SSH; each board checks every blob's sha256 itself and drops bytes that do not match,
   so a seed is transport only: a poisoned store can delay a board, never poison it.

Whatever a board still lacks afterwards the playbook sends from the workstation, as for a board in no site. Blobs
only: nothing is activated here; canary, batches and max-fail are the playbook's, as before.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from edgekit.bench import boardfs
from edgekit.bench.jobs import Job
from edgekit.errors import EdgekitError
from edgekit.fleet.connect import Fleet, Target
from edgekit.fleet.plan import FleetPlan
from edgekit.remote.transfer import Blob, drop_corrupt, push_blobs
from edgekit.resources import data_path

WAVE = 4  # boards pulling at once: each wave's boards serve the next one


@dataclass
class SiteReport:
    site: str
    members: list[str]
    seed: str | None = None
    workstation_bytes: int = 0  # what the workstation sent to this site (the seed's push)
    boards: dict[str, dict[str, Any]] = field(default_factory=dict)  # per board: bytes, sources, what it lacks
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def sites_of(fleet: Fleet, names: list[str], first: list[str]) -> dict[str, list[str]]:
    """Site → its boards among ``names`` (``first``, the canary, leads its site); a site of one is no site."""
    order = [n for n in first if n in names] + [n for n in names if n not in first]
    out: dict[str, list[str]] = {}
    for name in order:
        site = fleet.targets[name].board.site if name in fleet.targets else None
        if site:
            out.setdefault(site, []).append(name)
    return {s: m for s, m in out.items() if len(m) > 1}


def _url(target: Target) -> str:
    b = target.board
    return f"http://{b.site_host or b.host}:{b.site_port}"


def _nginx(target: Target) -> str:
    """nginx on the board: on the PATH, else where Debian and Ubuntu put it (/usr/sbin is not on every login's
    PATH); one sentence when it is not installed."""
    for probe in (["sh", "-c", 'command -v "$1"', "sh", "nginx"], ["test", "-x", "/usr/sbin/nginx"]):
        res = target.runner.run(probe, check=False, timeout=30)
        if res.ok:
            return res.stdout.strip() or "/usr/sbin/nginx"
    raise EdgekitError(f"Board {target.name!r} has no nginx to serve its site (apt install nginx-light).")


class _Server:
    """nginx on one board, serving its store to the site (a job of its own, stopped at the end)."""

    def __init__(self, target: Target, base: str, allow: list[str]) -> None:
        self.target, self.base = target, base
        self.run_dir = f"{base}/site/http-{secrets.token_hex(3)}"
        board = target.board
        conf = data_path("site", "nginx.conf").read_text().format(
            run=self.run_dir, store=f"{base}/store", user=board.user,
            listen=f"{board.site_host or board.host}:{board.site_port}",
            allow="\n".join(f"        allow {a};" for a in sorted(set(allow))), limit_rate=0)
        boardfs.mkdirs(target.runner, f"{self.run_dir}/job")
        boardfs.put_text(target.runner, f"{self.run_dir}/nginx.conf", conf)
        self.job = Job(target.runner, f"{self.run_dir}/job", "nginx")
        self.job.launch([_nginx(target), "-e", f"{self.run_dir}/error.log", "-p", self.run_dir,
                         "-c", f"{self.run_dir}/nginx.conf"])
        deadline = time.monotonic() + 10  # nginx writes its pid file once it listens
        while not target.runner.run(["test", "-s", f"{self.run_dir}/nginx.pid"], check=False, timeout=30).ok:
            if time.monotonic() > deadline or self.job.poll(0.2) != "running":
                err = target.runner.run(["cat", f"{self.run_dir}/error.log"], check=False, timeout=30).stdout \
                    or self.job.tail()
                self.stop()
                raise EdgekitError(f"nginx did not start on board {target.name!r}: "
                                   f"{(err.strip().splitlines() or ['no error log'])[-1]}")

    def stop(self) -> None:
        self.job.stop(grace_s=3.0)
        self.target.runner.run(["rm", "-rf", "--", self.run_dir], check=False, timeout=60)


def _pull(target: Target, base: str, blobs: list[Blob], sources: list[str]) -> dict[str, Any]:
    """``agent site-pull`` on the board; per blob where it came from (None: still missing)."""
    work = f"{base}/site/pull-{secrets.token_hex(3)}"
    try:
        agent = boardfs.push_agent(target.runner, f"{work}/agent")
        spec = {"store": f"{base}/store", "staging": f"{base}/site/staging", "sources": sources,
                "blobs": [{"sha256": b.sha256, "size": b.size, "executable": b.executable} for b in blobs]}
        boardfs.put_text(target.runner, f"{work}/spec.json", json.dumps(spec))
        res = target.runner.run(["python3", agent, "site-pull", f"{work}/spec.json"], check=False,
                                timeout=600 + sum(b.size for b in blobs) / 1e6)
        try:
            out = json.loads(res.stdout)
        except ValueError:
            raise EdgekitError(f"site-pull failed on board {target.name!r}: "
                               f"{(res.stderr.strip().splitlines() or ['no output'])[-1]}") from None
        if out.get("error"):
            raise EdgekitError(f"Board {target.name!r}: {out['error']}.")
        return out
    finally:
        target.runner.run(["rm", "-rf", "--", work], check=False, timeout=60)


def _board_result(out: dict[str, Any]) -> dict[str, Any]:
    got = [b for b in out["blobs"] if b["source"] not in (None, "present")]
    sources: dict[str, int] = {}
    for b in got:
        sources[b["source"]] = sources.get(b["source"], 0) + 1
    rejected = sum(1 for b in out["blobs"] for t in b["tries"] if (t["exit"] == 0 and not t["ok"]) or t["exit"] == 32)
    return {"bytes": sum(b["bytes"] for b in got), "blobs": len(got), "sources": sources,
            "missing": [b["sha256"] for b in out["blobs"] if b["source"] is None], "rejected_copies": rejected,
            "seconds": out.get("seconds")}


def stage_site(fleet: Fleet, fp: FleetPlan, site: str, members: list[str], say: Callable[[str], None]) -> SiteReport:
    """One site (see the module's docstring); never raises for one board: what fails falls back."""
    start = time.monotonic()
    report = SiteReport(site, members)
    need = {m: fp.boards[m].plan.blobs for m in members}
    union = list({b.sha256: b for bl in need.values() for b in bl}.values())
    allow = [t.board.site_host or t.board.host for t in (fleet.targets[m] for m in members)]
    servers: list[_Server] = []
    try:
        for seed in members:
            target = fleet.targets[seed]
            try:
                # What it will serve is hashed again first: a copy corrupted at rest is sent anew, not served
                # (the neighbours would reject it, and the seed would activate it).
                bad = drop_corrupt(target.runner, fp.boards[seed].base, union)
                if bad:
                    report.notes.append(f"{seed}: {len(bad)} stored blob(s) did not match their sha256; sent again")
                    say(f"site {site}: {seed} had {len(bad)} corrupted blob(s) in its store; sending them again")
                push = push_blobs(target.runner, fp.boards[seed].base, union)
                servers.append(_Server(target, fp.boards[seed].base, allow))
            except EdgekitError as exc:
                report.notes.append(f"{seed} could not seed: {exc}")
                say(f"site {site}: {seed} could not seed ({exc}); the next board tries")
                continue
            report.seed, report.workstation_bytes = seed, push.sent_bytes
            break
        if report.seed is None:
            report.notes.append("no board could seed: every board of the site gets its blobs from the workstation")
            return report
        say(f"site {site}: {report.seed} seeded ({report.workstation_bytes / 1e6:.1f} MB from the workstation); "
            f"{len(members) - 1} board(s) pull from it")
        sources = [_url(fleet.targets[report.seed])]
        rest = [m for m in members if m != report.seed]
        for k in range(0, len(rest), WAVE):
            wave = rest[k:k + WAVE]
            with ThreadPoolExecutor(max_workers=len(wave), thread_name_prefix="site-pull") as pool:
                futures = {m: pool.submit(_pull, fleet.targets[m], fp.boards[m].base, need[m], list(sources))
                           for m in wave}
                for m, fut in futures.items():
                    try:
                        report.boards[m] = _board_result(fut.result())
                    except EdgekitError as exc:
                        report.boards[m] = {"error": str(exc), "missing": [b.sha256 for b in need[m]]}
                        say(f"site {site}: {m} could not pull ({exc}); the workstation sends it its blobs")
            for m in wave:  # a board that has everything serves the next wave too
                if not report.boards[m].get("missing"):
                    try:
                        servers.append(_Server(fleet.targets[m], fp.boards[m].base, allow))
                        sources.append(_url(fleet.targets[m]))
                    except EdgekitError as exc:
                        report.notes.append(str(exc))
    finally:
        for server in servers:
            server.stop()
        report.seconds = round(time.monotonic() - start, 2)
    return report


def stage(fleet: Fleet, fp: FleetPlan, names: list[str], first: list[str],
          say: Callable[[str], None]) -> dict[str, dict[str, Any]]:
    """Every site among ``names``, one after another; site name → its report."""
    return {site: stage_site(fleet, fp, site, members, say).to_dict()
            for site, members in sites_of(fleet, names, first).items()}
