"""Sites: a rollout costs the workstation one release per site, not one per board.

Boards that reach each other cheaply share a ``site`` in the board file. Per site, before the playbook runs:

1. **Seed.** The site's blobs (every member's release) go once to one board — the canary where it is in the site,
   else the first — over edgekit's verified, resumable SSH push (its stored copies hashed again first). A seed
   that cannot take them or serve them hands the role to the next board; if none can, the site falls back to
   today's path.
2. **Serve.** Every board of the site serves its blob store read-only with the board's own nginx (Range requests:
   a cut download resumes), on ``site_host:site_port``, to the site's boards' addresses only, while the playbook
   runs; edgekit stops them after it.

Then the **playbook pulls**, board by board under its canary, batches and max-fail: the role's ``edgekit_blobs``
runs edgekit's agent/site_pull.py on each board of a site for what it lacks (aria2c, sources in order: the seed,
then boards of earlier batches, so a seed that dies hands over to a board that has finished), and sends what is
still missing from the workstation, as for a board in no site. The manifest of hashes comes from the workstation
over SSH; each board checks every blob's sha256 itself and drops bytes that do not match, so a seed is transport
only: a poisoned store can delay a board, never poison it.
"""

from __future__ import annotations

import contextlib
import secrets
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from edgekit.bench import boardfs
from edgekit.bench.jobs import Job
from edgekit.errors import EdgekitError
from edgekit.fleet.connect import Fleet, Target
from edgekit.fleet.plan import FleetPlan
from edgekit.remote import agent_call, agent_ship
from edgekit.remote.transfer import Blob, drop_corrupt, push_blobs
from edgekit.resources import data_path

MORE_SOURCES = 7  # boards tried after the seed, for a blob the seed cannot give


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


def _site_nginx(target: Target, base: str) -> dict[str, Any]:
    """The board's nginx (or None) and the run dirs of servers an earlier rollout left (agent/site_serve.py)."""
    return agent_call.call(target.runner, base, "site-nginx", base, timeout=30, doing="Looking for nginx")


class _Server:
    """nginx on one board, serving its store to the site (a job of its own, stopped at the end)."""

    def __init__(self, target: Target, base: str, allow: list[str], hold: Sequence[str] = ()) -> None:
        self.target, self.base = target, base
        self.run_dir = f"{base}/site/http-{secrets.token_hex(3)}"
        nginx = _site_nginx(target, base).get("nginx")
        if not nginx:
            raise EdgekitError(f"Board {target.name!r} has no nginx to serve its site (apt install nginx-light).")
        if hold:  # hard links in the run dir: the board's own activation (its prune) keeps what it serves
            agent_call.call(target.runner, base, "site-hold", f"{base}/store", f"{self.run_dir}/hold", *hold,
                            timeout=120, doing="Holding the blobs the site serves")
        board = target.board
        conf = data_path("site", "nginx.conf").read_text().format(
            run=self.run_dir, store=f"{base}/store", user=board.user,
            listen=f"{board.site_host or board.host}:{board.site_port}",
            allow="\n".join(f"        allow {a};" for a in sorted(set(allow))), limit_rate=0)
        boardfs.mkdirs(target.runner, f"{self.run_dir}/job")
        boardfs.put_text(target.runner, f"{self.run_dir}/nginx.conf", conf)
        self.job = Job(target.runner, agent_ship.ensure(target.runner, base), f"{self.run_dir}/job", "nginx")
        self.job.launch([str(nginx), "-e", f"{self.run_dir}/error.log", "-p", self.run_dir,
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


def _stop_leftovers(target: Target, base: str) -> None:
    """Servers an earlier rollout left running (its edgekit was killed while the playbook ran) are stopped: the board
    is locked by this rollout, so none of them is anyone's now."""
    for run_dir in _site_nginx(target, base).get("runs") or []:
        Job(target.runner, agent_ship.ensure(target.runner, base), f"{run_dir}/job", "nginx").stop(grace_s=3.0)
        target.runner.run(["rm", "-rf", "--", run_dir], check=False, timeout=60)


def _sources(order: list[str], seed: str, serving: list[str], urls: dict[str, str], board: str) -> list[str]:
    """Where ``board`` takes its blobs from, in order: the seed, then up to MORE_SOURCES boards that come before it
    in the rollout (earlier batches, done by then; one that is not answers 404 at once and the next is tried)."""
    earlier = [m for m in order[:order.index(board)] if m != seed and m in serving]
    return [urls[seed]] + [urls[m] for m in earlier[:MORE_SOURCES]]


def _seed(fleet: Fleet, fp: FleetPlan, report: SiteReport, union: list[Blob], allow: list[str],
          say: Callable[[str], None]) -> _Server | None:
    """The first board of the site that takes every blob and starts its server; None when none can."""
    for seed in report.members:
        target = fleet.targets[seed]
        try:
            # What it will serve is hashed again first: a copy corrupted at rest is sent anew, not served
            # (the neighbours would reject it, and the seed would activate it).
            bad = drop_corrupt(target.runner, fp.boards[seed].base, union)
            if bad:
                report.notes.append(f"{seed}: {len(bad)} stored blob(s) did not match their sha256; sent again")
                say(f"site {report.site}: {seed} had {len(bad)} corrupted blob(s) in its store; sending them again")
            push = push_blobs(target.runner, fp.boards[seed].base, union)
            server = _Server(target, fp.boards[seed].base, allow, hold=[b.sha256 for b in union])
        except EdgekitError as exc:
            report.notes.append(f"{seed} could not seed: {exc}")
            say(f"site {report.site}: {seed} could not seed ({exc}); the next board tries")
            continue
        report.seed, report.workstation_bytes = seed, push.sent_bytes
        return server
    return None


@dataclass
class Staged:
    """What the playbook needs of the sites (per pulling board: its sources and staging dir) and their reports."""
    reports: dict[str, SiteReport] = field(default_factory=dict)
    pulls: dict[str, dict[str, Any]] = field(default_factory=dict)

    def collect(self, hosts: dict[str, Any]) -> dict[str, dict[str, Any]]:
        """Each site's report with its boards' pulls, as the playbook's edgekit_blobs registered them."""
        for report in self.reports.values():
            for m in report.members:
                push = ((hosts.get(m) or {}).get("registered") or {}).get("edgekit_release_push") or {}
                if m == report.seed or m not in self.pulls or not push or push.get("skipped"):
                    continue
                report.boards[m] = push.get("site") or {"bytes": 0, "blobs": 0, "sources": {}, "missing": [],
                                                        "rejected_copies": 0, "seconds": 0.0}
        return {site: r.to_dict() for site, r in self.reports.items()}


@contextlib.contextmanager
def serving(fleet: Fleet, fp: FleetPlan, names: list[str], first: list[str],
            say: Callable[[str], None]) -> Iterator[Staged]:
    """Every site among ``names`` seeded and served (see the module's docstring) while the caller runs the
    playbook; the servers are stopped at the end. Never raises for one board: what fails falls back."""
    staged = Staged()
    servers: list[_Server] = []
    try:
        for site, members in sites_of(fleet, names, first).items():
            start = time.monotonic()
            report = staged.reports[site] = SiteReport(site, members)
            union = list({b.sha256: b for m in members for b in fp.boards[m].plan.blobs}.values())
            allow = [t.board.site_host or t.board.host for t in (fleet.targets[m] for m in members)]
            for m in members:
                _stop_leftovers(fleet.targets[m], fp.boards[m].base)
            seed_server = _seed(fleet, fp, report, union, allow, say)
            if seed_server is None:
                report.notes.append("no board could seed: every board of the site gets its blobs from the workstation")
                report.seconds = round(time.monotonic() - start, 2)
                continue
            servers.append(seed_server)
            serving_boards = [report.seed]
            for m in members:  # the others serve what they have: a board done in one batch serves the next ones
                if m != report.seed:
                    try:
                        servers.append(_Server(fleet.targets[m], fp.boards[m].base, allow))
                        serving_boards.append(m)
                    except EdgekitError as exc:
                        report.notes.append(str(exc))
            urls = {m: _url(fleet.targets[m]) for m in members}
            for m in members:
                if m != report.seed:
                    staged.pulls[m] = {"sources": _sources(members, report.seed, serving_boards, urls, m),
                                       "staging": f"{fp.boards[m].base}/site/staging"}
            report.seconds = round(time.monotonic() - start, 2)
            say(f"site {site}: {report.seed} seeded ({report.workstation_bytes / 1e6:.1f} MB from the "
                f"workstation); {len(members) - 1} board(s) pull from it in the playbook")
        yield staged
    finally:
        for server in servers:
            server.stop()
