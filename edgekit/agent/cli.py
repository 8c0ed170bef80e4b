"""The agent's command line: ``python3 <release>/agent/edgekit_agent.py <subcommand> ...``.

    sample    --out FILE [--hz 20] [--duration S] [--source auto] [--total-rail NAME|sum] [--pidfile F]
    idle      --seconds N [--hz 20] [--source auto] [--total-rail ...] [--out FILE]   static power baseline
    energy    FILE [--t0 T] [--t1 T]               energy / mean power / rate over [t0, t1] of a sample file
    snapshot  [--source auto]                       clocks, temperatures, nvpmodel, one power reading
    wait-cool --below C --timeout S [--zone NAME]   exit 0 once below C, 1 on timeout
    clock                                           this board's monotonic and wall clocks
    load      --port P --prompts FILE ...           streaming load against llama-server (see load.py)
    activate  --base B --release ID --port P ...    make a release the one the board serves (see activate.py)
    rollback  --base B --release ID --port P ...    an earlier release back in service, checked first
    watchdog  --base B --port P --unit U --log L    restart a wedged server, cap its logs (runs as a unit)
    site-pull SPEC                                  a release's blobs from the site's boards (see site_pull.py)
    unit-install --base B --release R --unit U | --spec FILE    a unit from its spec (see units.py)
    unit-remove --unit U                            a unit stopped, disabled and deleted
    unit-state UNIT                                 its file's sha256, whether it is active and enabled
    inventory [--create] STORE SHA...               blobs present, partial uploads, free space (see blobstore.py)
    receive   STORE SHA SIZE OFFSET [--executable] [--upto END]   a blob from stdin, resumed, hashed, placed
    hash      [--parts] STORE SHA...                sha256 of stored blobs (or of their .part)
    check     [--release DIR] STORE SHA...          stored blobs hashed again; a corrupt one deleted
    verify-store BASE [--repair]                    the whole store hashed again; who holds a bad blob (store_verify.py)
    follow    PATH SIZE ...                         hash uploads while they land (a JSON line per file)
    place     [--tar] STORE SHA MODE ... [-- CMD]   uploads (or a tar of them on stdin) checked and placed; then CMD
    guard     [--lock F] [--wait S] [--await F] [--undo ARGV_JSON]   locks held, and undo run, as long as the channel
    release-create BASE ID [PATH SHA]...            releases/<ID> made of hard links to the store (board_releases.py)
    release-pin    BASE ID SHA...                   a pushed release's blobs kept through other deploys' prunes
    release-list   BASE                             current, serving, its health record, the releases oldest first
    release-switch [--serving] BASE ID              current (and serving) pointed at a release, atomically
    litert-front --model B --port P ...             the LiteRT-LM front (litert_server.py), under LiteRT-LM's Python
    health    --port P [--unit U] [--log F] ...     a release's server checked: one Health (see health.py)
    state     BASE [--release R] [--unit U [--older NAME]...]   releases, manifests, service (board_state.py)
    job-start DIR ARGV...                           a command in the background, in a session of its own (jobs.py)
    job-wait  DIR POLLS [--collect FILE]            up to POLLS × 0.1 s: done (exit code, FILE's text), running, gone
    job-stop  DIR GRACE                             SIGTERM, GRACE seconds, then SIGKILL to the job's process group
    site-hold STORE DIR SHA...                      hard links of blobs a site's board serves (site_serve.py)
    site-nginx BASE                                 the board's nginx, and servers an earlier rollout left
    python-has [--dist D]... [--module M]...        what the Python running this verb has (python_has.py)
    cuda-tree                                       the board's CUDA target tree as a tar on stdout (cuda_tree.py)
    key-place BASE [--env NAME]…                    the API key from stdin into BASE/keys, 0600 (key_place.py)

Every subcommand but watchdog, follow and cuda-tree prints one JSON object on stdout. Errors: one sentence on
stderr, exit 2.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import re
import signal
import sys
import time
from typing import Any, Iterator


class _Lazy:
    """A sibling module, imported when a verb first uses it. The zipapp caches no bytecode, so every module a call
    imports is compiled again on each call: a store verb must not pay for the power sampler and the activation."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._module: Any = None

    def __getattr__(self, attr: str) -> Any:
        if self._module is None:
            self._module = importlib.import_module("." + self._name, __package__)
        return getattr(self._module, attr)


activate_cmd, blobstore, board_releases = _Lazy("activate"), _Lazy("blobstore"), _Lazy("board_releases")
energy, extras, guard, service_exec = _Lazy("energy"), _Lazy("extras"), _Lazy("guard"), _Lazy("service_exec")
health, board_state, jobs = _Lazy("health"), _Lazy("board_state"), _Lazy("jobs")
site_serve, python_has, cuda_tree = _Lazy("site_serve"), _Lazy("python_has"), _Lazy("cuda_tree")
store_verify, key_place = _Lazy("store_verify"), _Lazy("key_place")
site_pull, sources, units, watchdog = _Lazy("site_pull"), _Lazy("sources"), _Lazy("units"), _Lazy("watchdog")
load_cmd, sampler_mod = _Lazy("load"), _Lazy("sampler")


class AgentError(Exception):
    """A failure the caller can act on: printed as one sentence, exit 2."""


class _StopFlag:
    """SIGTERM / SIGINT / SIGHUP → stop at the next sample, and say which signal it was.

    A SIGHUP that is already ignored stays ignored: ``nohup ... &`` over SSH must outlive the session.
    """

    def __init__(self) -> None:
        self.reason: str | None = None

    def __call__(self) -> str | None:
        return self.reason

    def _handle(self, signum: int, _frame: Any) -> None:
        self.reason = signal.Signals(signum).name

    @contextlib.contextmanager
    def installed(self) -> Iterator[_StopFlag]:
        sigs = [signal.SIGTERM, signal.SIGINT]
        if signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN:
            sigs.append(signal.SIGHUP)
        old = {s: signal.signal(s, self._handle) for s in sigs}
        try:
            yield self
        finally:
            for s, h in old.items():
                signal.signal(s, h)


def _emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def _sample_into(args: argparse.Namespace, out: Any, keep: bool, duration: float | None) -> tuple[Any, dict]:
    source, skipped = sources.open_source(args.source, args.hz)
    sampler = sampler_mod.Sampler(source, args.hz, out=out, total_rail=args.total_rail, duration_s=duration, keep=keep,
                      skipped=skipped)
    try:
        with _StopFlag().installed() as stop:
            end = sampler.run(stop)
    finally:
        if source is not None:
            source.close()
    return sampler, end


def cmd_sample(args: argparse.Namespace) -> int:
    if args.pidfile:
        with open(args.pidfile, "w") as fh:
            fh.write(f"{os.getpid()}\n")
    try:
        with open(args.out, "w", buffering=1, encoding="utf-8") as out:  # line-buffered: readers follow it
            sampler, end = _sample_into(args, out, keep=False, duration=args.duration)
    finally:
        if args.pidfile:
            with contextlib.suppress(OSError):
                os.unlink(args.pidfile)
    meta = sampler.meta
    if meta.get("power") == "unavailable":
        _emit({"power": "unavailable", "reasons": meta.get("reasons", {}), "out": args.out})
        return 0
    _emit({"power": "available", "source": meta.get("source"), "total_rail": meta.get("total_rail"),
           "total_is_sum": meta.get("total_is_sum"), "out": args.out, **end})
    return 0


def cmd_idle(args: argparse.Namespace) -> int:
    with contextlib.ExitStack() as stack:
        out = stack.enter_context(open(args.out, "w", buffering=1, encoding="utf-8")) if args.out else None
        sampler, end = _sample_into(args, out, keep=True, duration=args.seconds)
    meta = sampler.meta
    if meta.get("power") == "unavailable":
        _emit({"power": "unavailable", "reasons": meta.get("reasons", {}), "static_power_baseline_watts": None})
        return 0
    try:
        win = energy.window_energy(sampler.samples)
    except energy.CoverageError as exc:
        raise AgentError(f"the idle measurement has no usable samples ({exc})") from None
    _emit({"power": "available", "source": meta.get("source"), "total_rail": meta.get("total_rail"),
           "total_is_sum": meta.get("total_is_sum"), "static_power_baseline_watts": win.mean_power_w,
           "sampling_rate_hz": win.sampling_rate_hz, "samples": win.samples_in_window, "window": win.to_json(),
           "reason": end["reason"]})
    return 0


def cmd_energy(args: argparse.Namespace) -> int:
    try:
        meta, samples, end = energy.read_samples(args.file)
    except OSError as exc:
        raise AgentError(f"cannot read {args.file}: {exc.strerror}") from None
    if meta.get("power") == "unavailable":
        _emit({"power": "unavailable", "reasons": meta.get("reasons", {})})
        return 0
    try:
        win = energy.window_energy(samples, args.t0, args.t1)
    except energy.CoverageError as exc:
        raise AgentError(str(exc)) from None
    _emit({"power": "available", "source": meta.get("source"), "total_rail": meta.get("total_rail"),
           "total_is_sum": meta.get("total_is_sum"), "file_sampling_rate_hz": (end or {}).get("sampling_rate_hz"),
           **win.to_json()})
    return 0


def cmd_snapshot(args: argparse.Namespace) -> int:
    snap = extras.snapshot()
    source, skipped = sources.open_source(args.source, args.hz)
    if source is None:
        snap["power"] = {"power": "unavailable", "reasons": skipped}
    else:
        try:
            got = source.read()
        finally:
            source.close()
        rails = got[1] if got else {}
        total, is_sum = sources.choose_total(sorted(rails), args.total_rail)
        snap["power"] = {"power": "available", **source.describe(), "rails": rails, "total_rail": total,
                         "total_is_sum": is_sum, "total_mw": sources.total_mw(rails, total), "skipped": skipped}
    _emit(snap)
    return 0


def cmd_wait_cool(args: argparse.Namespace) -> int:
    res = extras.wait_cool(args.below, args.timeout, zone=args.zone, poll_s=args.poll)
    res["below_c"] = args.below
    _emit(res)
    return 1 if res["cooled"] is False else 0


def cmd_clock(_args: argparse.Namespace) -> int:
    _emit({"monotonic": time.monotonic(), "wall": time.time()})
    return 0


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive: {text!r}")
    return value


def _power_args(p: argparse.ArgumentParser, hz: bool = True) -> None:
    if p.get_default("stub"):  # a verb not asked for: its sources module stays unimported
        return
    p.add_argument("--source", choices=sources.KINDS, default="auto",
                   help="power source: auto = jtop, else hwmon, else tegrastats (default: auto)")
    p.add_argument("--total-rail", default=None, metavar="NAME|sum",
                   help="rail that is the board's total (default: VIN, VDD_IN, VIN_SYS_5V0 or POM_5V_IN; "
                        "else the sum of the rails)")
    if hz:
        p.add_argument("--hz", type=_positive, default=20.0, help="samples per second (default 20; ≥ 10 to integrate)")


class _Verbs:
    """The subcommands, each built only when it is the one asked for (the others are listed, for --help and the
    refusal of a verb that does not exist): building one imports its modules."""

    def __init__(self, sub: Any, only: str | None) -> None:
        self.sub, self.only = sub, only

    def wants(self, name: str) -> bool:
        return self.only is None or self.only == name

    def add_parser(self, name: str, **kw: Any) -> argparse.ArgumentParser:
        if self.wants(name):
            return self.sub.add_parser(name, **kw)
        self.sub.add_parser(name, help=kw.get("help"), add_help=False)
        stub = argparse.ArgumentParser(prog=name, add_help=False)  # built and thrown away: cheap, imports nothing
        stub.set_defaults(stub=True)
        return stub


def parser(only: str | None = None) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="edgekit_agent", description="edgekit's board-side agent")
    real = ap.add_subparsers(dest="cmd", metavar="SUBCOMMAND")
    real.required = True  # 3.8: add_subparsers(required=...) exists, but keep it obvious
    sub = _Verbs(real, only)
    p = sub.add_parser("sample", help="stream power samples to a file until SIGTERM/SIGINT or --duration")
    p.add_argument("--out", required=True, help="JSON-lines file to write")
    p.add_argument("--duration", type=_positive, default=None, help="stop after this many seconds")
    p.add_argument("--pidfile", default=None, help="write this process's pid here while sampling")
    _power_args(p)
    p.set_defaults(fn=cmd_sample)
    p = sub.add_parser("idle", help="static power baseline: mean total power over --seconds")
    p.add_argument("--seconds", type=_positive, default=10.0)
    p.add_argument("--out", default=None, help="also keep the raw samples in this file")
    _power_args(p)
    p.set_defaults(fn=cmd_idle)
    p = sub.add_parser("energy", help="energy and mean power of a sample file over [t0, t1]")
    p.add_argument("file")
    p.add_argument("--t0", type=float, default=None, help="window start, board monotonic s (default: first)")
    p.add_argument("--t1", type=float, default=None, help="window end (default: last sample)")
    p.set_defaults(fn=cmd_energy)
    p = sub.add_parser("snapshot", help="clocks, temperatures, nvpmodel mode and one power reading")
    _power_args(p)
    p.set_defaults(fn=cmd_snapshot)
    p = sub.add_parser("wait-cool", help="wait until the board is below a temperature")
    p.add_argument("--below", type=float, required=True, help="°C")
    p.add_argument("--timeout", type=float, required=True, help="seconds")
    p.add_argument("--zone", default=None, help="thermal zone type (default: the hottest zone)")
    p.add_argument("--poll", type=float, default=1.0, help="seconds between readings")
    p.set_defaults(fn=cmd_wait_cool)
    p = sub.add_parser("clock", help="this board's monotonic and wall clocks")
    p.set_defaults(fn=cmd_clock)
    if sub.wants("load"):
        load_cmd.add_parser(real)
    else:
        sub.add_parser("load", help="streaming load against llama-server on this board (TTFT, tokens, drafts)")
    p = sub.add_parser("activate", help="make a release the one the board serves (candidate, restart, check)")
    if sub.wants("activate"):
        activate_cmd.add_arguments(p)
    p.set_defaults(fn=cmd_activate)
    p = sub.add_parser("rollback", help="restart an earlier release, check it, and only then make it current")
    if sub.wants("rollback"):
        activate_cmd.add_arguments(p, rollback_only=True)
    p.set_defaults(fn=cmd_rollback)
    p = sub.add_parser("watchdog", help="restart a service that stops answering /health; cap its logs")
    if sub.wants("watchdog"):
        watchdog.add_arguments(p)
    p.set_defaults(fn=lambda a: watchdog.main(a))
    p = sub.add_parser("exec", help="run a service's program with its log and key file opened as its own user")
    if sub.wants("exec"):
        service_exec.add_arguments(p)
    p.set_defaults(fn=lambda a: service_exec.main(a))
    p = sub.add_parser("site-pull", help="take missing blobs from the site's boards over HTTP (aria2c), sha256-checked")
    p.add_argument("spec", help="JSON: store, staging, blobs, sources")
    p.set_defaults(fn=lambda a: site_pull.main(a.spec))
    p = sub.add_parser("unit-install", help="install a unit rendered from its spec (a release's, or a file)")
    if sub.wants("unit-install"):
        units.add_install_arguments(p)
    p.set_defaults(fn=lambda a: _emit(units.cmd_install(a)) or 0)
    p = sub.add_parser("unit-remove", help="stop, disable and delete a unit")
    p.add_argument("--unit", required=True)
    p.set_defaults(fn=lambda a: _emit(units.cmd_remove(a)) or 0)
    p = sub.add_parser("unit-state", help="a unit file's sha256, and whether it is active and enabled")
    p.add_argument("unit")
    p.set_defaults(fn=lambda a: _emit(units.state(a.unit)) or 0)
    _store_verbs(sub)
    _release_verbs(sub)
    p = sub.add_parser("litert-front", help="the llama-server-compatible front for LiteRT-LM (litert_server.py)",
                       add_help=False)
    p.add_argument("args", nargs=argparse.REMAINDER)
    p.set_defaults(fn=cmd_litert_front)
    p = sub.add_parser("guard", help="hold locks while edgekit's channel lives; when it closes, run the undo commands")
    if sub.wants("guard"):
        guard.add_arguments(p)
    p.set_defaults(fn=lambda a: guard.run(a))
    p = sub.add_parser("health", help="a release's server checked: /health, a completion with tokens (and drafts)")
    if sub.wants("health"):
        health.add_arguments(p)
    p.set_defaults(fn=cmd_health)
    p = sub.add_parser("state", help="a board's release state: releases, manifests, the service, the root prefix")
    p.add_argument("base")
    p.add_argument("--release", default="", help="also say whether this release is here, with its manifest")
    p.add_argument("--unit", default="", help="the service: is it (or it under an --older name) active")
    p.add_argument("--older", action="append", default=[], metavar="NAME", help="an older name of --unit")
    p.set_defaults(fn=lambda a: _emit(board_state.state(a.base, a.release, a.unit, a.older)) or 0)
    _job_verbs(sub)
    p = sub.add_parser("site-hold", help="hard links of store blobs in a directory, kept through the store's prunes")
    p.add_argument("store")
    p.add_argument("dir")
    _sha_list(p)
    p.set_defaults(fn=lambda a: _emit(site_serve.hold(a.store, a.dir, a.shas)) or 0)
    p = sub.add_parser("site-nginx", help="the board's nginx, and the site servers an earlier rollout left")
    p.add_argument("base")
    p.set_defaults(fn=lambda a: _emit(site_serve.nginx(a.base)) or 0)
    p = sub.add_parser("python-has", help="the distributions' versions and the modules' imports of this Python")
    p.add_argument("--dist", action="append", default=[], help="a distribution whose version to report")
    p.add_argument("--module", action="append", default=[], help="a module that must import")
    p.set_defaults(fn=lambda a: _emit(python_has.report(a.dist, a.module)) or 0)
    p = sub.add_parser("key-place", help="the API key, read from stdin, into BASE/keys (api.key, NAME.env), 0600")
    p.add_argument("base")
    p.add_argument("--env", action="append", default=[], metavar="NAME",
                   help="also NAME.env (NAME=key): for a server that reads its key from that variable")
    p.set_defaults(fn=lambda a: _emit(key_place.place(a.base, sys.stdin.buffer.read(key_place.MAX_KEY_BYTES + 1),
                                                      a.env)) or 0)
    p = sub.add_parser("cuda-tree", help="the board's CUDA target tree (include/, lib/) as a tar on stdout")
    p.set_defaults(fn=lambda a: cuda_tree.stream())
    return ap


def _job_verbs(sub: Any) -> None:
    p = sub.add_parser("job-start", help="a command in the background, in a session of its own, in a job dir")
    # One REMAINDER: the command's own options must not be read as ours.
    p.add_argument("args", nargs=argparse.REMAINDER, metavar="DIR ARGV ...")
    p.set_defaults(fn=cmd_job_start)
    p = sub.add_parser("job-wait", help="wait a little for a job: done (its exit code), running or gone")
    p.add_argument("dir")
    p.add_argument("polls", type=int)
    p.add_argument("--collect", default="", metavar="FILE", help="a file whose text comes with a done answer")
    p.set_defaults(fn=lambda a: _emit(jobs.wait(a.dir, a.polls, a.collect)) or 0)
    p = sub.add_parser("job-stop", help="stop a job: SIGTERM to its command, then SIGKILL to its process group")
    p.add_argument("dir")
    p.add_argument("grace", type=float)
    p.set_defaults(fn=lambda a: _emit(jobs.stop(a.dir, a.grace)) or 0)


def cmd_job_start(args: argparse.Namespace) -> int:
    if not args.args:
        raise AgentError("job-start takes a job directory first")
    _emit(jobs.start(args.args[0], args.args[1:]))
    return 0


def _sha(text: str) -> str:
    try:
        return blobstore.check_sha(text)
    except blobstore.StoreError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _sha_list(p: argparse.ArgumentParser) -> None:
    p.add_argument("shas", nargs="*", metavar="SHA", type=_sha)


def _store_verbs(sub: Any) -> None:
    p = sub.add_parser("inventory", help="which blobs the store has, partial uploads and free space")
    p.add_argument("store")
    p.add_argument("--create", action="store_true", help="make the store first")
    _sha_list(p)
    p.set_defaults(fn=lambda a: _emit(blobstore.inventory(a.store, a.shas, a.create)) or 0)
    p = sub.add_parser("receive", help="a blob from stdin into the store: resumed, hashed, placed atomically")
    p.add_argument("store")
    p.add_argument("sha", type=_sha)
    p.add_argument("size", type=int)
    p.add_argument("offset", type=int)
    p.add_argument("--executable", action="store_true")
    p.add_argument("--upto", type=int, default=None, help="only bytes OFFSET..UPTO in this call (appended, flushed)")
    p.set_defaults(fn=cmd_receive)
    p = sub.add_parser("hash", help="sha256 of stored blobs (or, with --parts, of their uploads, fsynced)")
    p.add_argument("store")
    p.add_argument("--parts", action="store_true")
    _sha_list(p)
    p.set_defaults(fn=lambda a: _emit(blobstore.hash_blobs(a.store, a.shas, a.parts)) or 0)
    p = sub.add_parser("check", help="stored blobs hashed again; one whose sha256 is not its name is deleted")
    p.add_argument("--release", default=None, metavar="DIR",
                   help="<base>/releases/<id> about to be activated: removed (unless current) when a blob was bad")
    p.add_argument("store")
    _sha_list(p)
    p.set_defaults(fn=lambda a: _emit(blobstore.check(a.store, a.shas, a.release)) or 0)
    p = sub.add_parser("verify-store", help="every blob of the store hashed again; the releases that hold a bad one")
    p.add_argument("base")
    p.add_argument("--repair", action="store_true",
                   help="delete bad blobs no current release holds; remove the other releases that hold one")
    p.set_defaults(fn=lambda a: _emit(store_verify.verify(a.base, a.repair)) or 0)
    p = sub.add_parser("follow", help="hash files while another channel uploads them (a JSON line per file)")
    p.add_argument("pairs", nargs="+", metavar="PATH SIZE")
    p.set_defaults(fn=cmd_follow)
    p = sub.add_parser("place", help="uploaded parts checked, made durable and placed; then a command if all were")
    p.add_argument("--tar", action="store_true", help="first unpack a tar stream of <sha>.part files from stdin")
    # One REMAINDER from the store on: argparse would drop a "--" that directly follows a positional of its own.
    p.add_argument("args", nargs=argparse.REMAINDER, metavar="STORE SHA MODE ... [-- COMMAND ...]",
                   help="octal modes; after --, a command run in this process's place once every part was good")
    p.set_defaults(fn=cmd_place)


_ID = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._+-]*$")
_REL = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._+-]*(/[A-Za-z0-9_][A-Za-z0-9._+-]*)*$")


def _release_id(text: str) -> str:
    if not _ID.match(text) or ".." in text:
        raise argparse.ArgumentTypeError(f"{text!r} is not a release id")
    return text


def _release_verbs(sub: Any) -> None:
    p = sub.add_parser("release-create", help="releases/<ID> made of hard links to blobs already in the store")
    p.add_argument("base")
    p.add_argument("release", type=_release_id)
    p.add_argument("pairs", nargs="*", metavar="PATH SHA")
    p.set_defaults(fn=cmd_release_create)
    p = sub.add_parser("release-pin", help="a pushed, not yet activated release's blobs kept through prunes")
    p.add_argument("base")
    p.add_argument("release", type=_release_id)
    _sha_list(p)
    p.set_defaults(fn=cmd_release_pin)
    p = sub.add_parser("release-list", help="current, serving, current's health record, the releases oldest first")
    p.add_argument("base")
    p.set_defaults(fn=lambda a: _emit(board_releases.Layout(a.base).listing()) or 0)
    p = sub.add_parser("release-switch", help="point current (and with --serving, serving) at a release")
    p.add_argument("--serving", action="store_true", help="also record it as the release the service runs")
    p.add_argument("base")
    p.add_argument("release", type=_release_id)
    p.set_defaults(fn=cmd_release_switch)


def cmd_release_create(args: argparse.Namespace) -> int:
    pairs = args.pairs
    if len(pairs) % 2:
        raise AgentError("release-create takes PATH SHA pairs")
    files = [(pairs[i], blobstore.check_sha(pairs[i + 1])) for i in range(0, len(pairs), 2)]
    for rel, _ in files:
        if not _REL.match(rel) or ".." in rel.split("/"):
            raise AgentError(f"{rel!r} is not a safe path inside a release")
    # sys.argv[0]: the zipapp this runs from, linked into the release (it stays as long as the release does).
    made = board_releases.Layout(args.base).create(args.release, files, os.path.abspath(sys.argv[0]))
    _emit({"release": args.release, "created": made})
    return 0


def cmd_release_pin(args: argparse.Namespace) -> int:
    shas = sorted(set(args.shas))
    board_releases.Layout(args.base).pin(args.release, shas)
    _emit({"release": args.release, "pinned": len(shas)})
    return 0


def cmd_release_switch(args: argparse.Namespace) -> int:
    lay = board_releases.Layout(args.base)
    try:
        lay.switch(args.release)
    except FileNotFoundError:
        raise AgentError(f"{args.base} has no release {args.release}") from None
    if args.serving:
        lay.mark_serving(args.release)
    _emit({"current": args.release, "serving": lay.serving})
    return 0


def cmd_health(args: argparse.Namespace) -> int:
    unknown = health.unknown_media(args)
    if unknown:
        raise AgentError("no media probe for " + ", ".join(unknown))
    _emit(health.check(args))
    return 0


def cmd_litert_front(args: argparse.Namespace) -> int:
    # Run by the board's LiteRT-LM Python, which imports litert_lm; the agent's python3 never imports it.
    from . import litert_server

    litert_server.main(args.args)
    return 0


def cmd_receive(args: argparse.Namespace) -> int:
    got = blobstore.receive(args.store, args.sha, args.size, args.offset, args.executable, blobstore.stdin_bytes(),
                            args.upto)
    _emit(got)
    return blobstore.CUT if got["cut"] else 0


def cmd_follow(args: argparse.Namespace) -> int:
    if len(args.pairs) % 2:
        raise AgentError("follow takes PATH SIZE pairs")
    return blobstore.follow([(args.pairs[i], int(args.pairs[i + 1])) for i in range(0, len(args.pairs), 2)])


def cmd_place(args: argparse.Namespace) -> int:
    if not args.args or args.args[0] == "--":
        raise AgentError("place takes a store first")
    store, rest = args.args[0], list(args.args[1:])
    cut = rest.index("--") if "--" in rest else len(rest)
    pairs, then = rest[:cut], rest[cut + 1:]
    if len(pairs) % 2:
        raise AgentError("place takes SHA MODE pairs")
    modes = {blobstore.check_sha(pairs[i]): int(pairs[i + 1], 8) for i in range(0, len(pairs), 2)}
    if args.tar:
        blobstore.untar_parts(store, set(modes), blobstore.stdin_bytes())
    got = blobstore.place_parts(store, modes)
    _emit(got)
    if then and not got["bad"]:
        os.execvp(then[0], then)  # e.g. the release made from these blobs: one round trip for both
    return 0


def cmd_activate(args: argparse.Namespace) -> int:
    host = activate_cmd.Host(args.host_holds_stdin)
    with activate_cmd.board_lock(args.base):
        try:
            result = activate_cmd.activate(args, activate_cmd.Units(), host=host)
        except activate_cmd.HostGone:
            result = {"release": args.release, "ok": False, "changed": False, "abandoned": True}
        except (OSError, RuntimeError) as exc:  # the host still gets a result, with why
            result = {"release": args.release, "ok": False, "changed": False, "error": str(exc)}
    activate_cmd.say("result", result)
    return 0


def cmd_rollback(args: argparse.Namespace) -> int:
    with activate_cmd.board_lock(args.base):
        activate_cmd.say("result", activate_cmd.rollback(args, activate_cmd.Units()))
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["litert-front"]:  # its options are the front's own (argparse would take --model for ours)
        return cmd_litert_front(argparse.Namespace(args=argv[1:]))
    args = parser(argv[0] if argv and not argv[0].startswith("-") else None).parse_args(argv)
    try:
        return int(args.fn(args))
    # ValueError: values argparse can't check (e.g. --hz 0); RuntimeError: a unit operation the board refused
    # OSError: the board's filesystem refused (a missing blob, a full disk, a permission)
    except (AgentError, blobstore.StoreError, guard.GuardError, OSError, ValueError, RuntimeError) as exc:
        sys.stderr.write(f"error: {exc}.\n")
        return 2
