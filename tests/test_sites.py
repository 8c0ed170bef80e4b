"""Seed boards per site: a rollout sends each blob once per site, the site's boards take it from each other.

* A rollout to a simulated site of three boards and one board outside any site, each board in a network namespace
  of its own on one bridge, all behind one uplink (`edgekit.sim.netns.site`, the bytes counted on the uplink's
  veth and on the seed's bridge port): the workstation sends the release about twice (once to the site's seed,
  once to the outsider), not four times, and the neighbours' copies cross the bridge from the seed; every board
  serves the release and every blob on every board has its sha256.
* The pull itself (`agent site-pull`, the real nginx the seeds run, the real aria2c): a poisoned copy at the
  first source is rejected and the blob taken from the next; a source that dies mid-blob is resumed from the
  next one, from where it stopped.
"""

from __future__ import annotations

import contextlib
import getpass
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from build_helpers import sdist_or_skip
from cli_helpers import edgekit

from edgekit.bench.jobs import Job
from edgekit.config.boardfile import Boards
from edgekit.remote import agent_ship
from edgekit.remote.runner import LocalRunner
from edgekit.resources import data_path
from edgekit.sim import faults, netns
from edgekit.sim.link import Link, route_to

REPO = Path(__file__).resolve().parents[1]
AGENT = REPO / "edgekit" / "agent" / "edgekit_agent.py"
tools = pytest.mark.skipif(not (shutil.which("nginx") and shutil.which("aria2c")),
                           reason="nginx and aria2c come with .ci/install")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def nginx(store: Path, port: int, run: Path, limit_rate: str = "0") -> Iterator[subprocess.Popen]:
    """The seed's server as edgekit.fleet.sites starts it (its config, read-only, loopback allowed)."""
    run.mkdir(parents=True)
    conf = data_path("site", "nginx.conf").read_text().format(run=run, store=store, listen=f"127.0.0.1:{port}",
                                                              user=getpass.getuser(),
                                                              allow="        allow 127.0.0.1;", limit_rate=limit_rate)
    (run / "nginx.conf").write_text(conf)
    proc = subprocess.Popen(["nginx", "-e", str(run / "error.log"), "-p", str(run), "-c", str(run / "nginx.conf")])
    try:
        for _ in range(100):
            if (run / "nginx.pid").exists():
                break
            time.sleep(0.05)
        assert (run / "nginx.pid").exists(), (run / "error.log").read_text()
        yield proc
    finally:
        proc.terminate()
        proc.wait(10)


def pull(tmp: Path, blob: bytes, sources: list[str]) -> dict:
    sha = hashlib.sha256(blob).hexdigest()
    tmp.mkdir(exist_ok=True)
    spec = {"store": str(tmp / "store"), "staging": str(tmp / "staging"), "sources": sources,
            "blobs": [{"sha256": sha, "size": len(blob), "executable": False}]}
    (tmp / "spec.json").write_text(json.dumps(spec))
    res = subprocess.run([sys.executable, str(AGENT), "site-pull", str(tmp / "spec.json")], capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)["blobs"][0]


@tools
def test_a_poisoned_copy_is_rejected_and_the_next_source_used(tmp_path: Path) -> None:
    blob = os.urandom(3 << 20)
    sha = hashlib.sha256(blob).hexdigest()
    bad, good = tmp_path / "bad", tmp_path / "good"
    for store, data in ((bad, blob[:1000] + bytes([blob[1000] ^ 1]) + blob[1001:]), (good, blob)):
        store.mkdir()
        (store / sha).write_bytes(data)
    pa, pb = free_port(), free_port()
    with nginx(bad, pa, tmp_path / "run-a"), nginx(good, pb, tmp_path / "run-b"):
        out = pull(tmp_path / "board", blob, [f"http://127.0.0.1:{pa}", f"http://127.0.0.1:{pb}"])
    assert out["source"] == f"http://127.0.0.1:{pb}"
    assert [t["ok"] for t in out["tries"]] == [False, True]
    landed = tmp_path / "board" / "store" / sha
    assert hashlib.sha256(landed.read_bytes()).hexdigest() == sha
    assert not list((tmp_path / "board" / "staging").iterdir())  # nothing of the poisoned copy kept


@tools
def test_a_source_that_dies_mid_blob_hands_over_to_the_next_from_its_first_byte(tmp_path: Path) -> None:
    """A cut source's part file goes with it: the next source's bytes are never appended to another's."""
    blob = os.urandom(24 << 20)
    sha = hashlib.sha256(blob).hexdigest()
    store = tmp_path / "seed"
    store.mkdir()
    (store / sha).write_bytes(blob)
    pa, pb = free_port(), free_port()
    part = tmp_path / "board" / "staging" / sha

    def die_at_8_mib(link: Link) -> None:  # the seed goes away once 8 MiB of the blob landed
        while not part.exists() or part.stat().st_size < 8 << 20:
            time.sleep(0.02)
        link.partition()

    with nginx(store, pa, tmp_path / "run-a", limit_rate="4m"), nginx(store, pb, tmp_path / "run-b"), \
            Link(pa) as link:
        killer = threading.Thread(target=die_at_8_mib, args=(link,), daemon=True)
        killer.start()
        out = pull(tmp_path / "board", blob, [f"http://127.0.0.1:{link.port}", f"http://127.0.0.1:{pb}"])
        killer.join(5)
    print(f"\ncut at 8 MiB of 24: {out['tries']}; {out['bytes'] / 2**20:.1f} MiB from the second source")
    assert out["source"] == f"http://127.0.0.1:{pb}" and out["tries"][0]["ok"] is False
    assert out["bytes"] == len(blob)  # from byte 0: a resume continues only from the same source
    assert hashlib.sha256((tmp_path / "board" / "store" / sha).read_bytes()).hexdigest() == sha
    assert not any((tmp_path / "board" / "staging").iterdir())  # emptied after the pull


@pytest.fixture(scope="module")
def env(sim_session) -> dict[str, str]:  # type: ignore[no-untyped-def]
    return {**os.environ, **sim_session.env, "EDGEKIT_LLAMA_SRC": str(sdist_or_skip())}


@tools
@pytest.mark.skipif(not netns.available(), reason="needs root and iproute2 (network namespaces)")
def test_a_site_takes_each_blob_once_from_the_workstation(sim_session, env: dict[str, str]) -> None:  # type: ignore[no-untyped-def]
    boards = sim_session.boards(4, fresh=True)
    board_file = Boards(Path(env["EDGEKIT_CONFIG"]))
    known = Path(env["EDGEKIT_CONFIG_DIR"]) / "known_hosts"
    names: list[str] = []
    with contextlib.ExitStack() as stack:
        lan = stack.enter_context(netns.site(None, boards=4))  # each board in its own namespace, on one bridge
        for i, b in enumerate(boards):
            host, port = stack.enter_context(netns.sshd_in(lan, i, b.dir / "ssh" / "sshd_config",
                                                           b.dir / "sshd-site.log"))
            site = {"site": "lab", "site_host": host} if i < 3 else {}  # site_port: the default, 8089
            names.append(route_to(Path(env["EDGEKIT_CONFIG"]), known, b.name, host, port, **site))
        stack.callback(board_file.update, remove=names)
        data = board_file.load()
        data.groups["sites"] = names
        board_file.save(data)
        before, seed_before = lan.uplink.tx_bytes(), lan.sent_by(0)
        res = edgekit("--json", "fleet", "rollout", "--recipe", "sim-tiny-mtp", "--group", "sites", "--no-canary",
                      env=env)
        sent, seed_sent = lan.uplink.tx_bytes() - before, lan.sent_by(0) - seed_before
        wrong = {b.name: faults.violations(b, netns=lan.namespaces[i]) for i, b in enumerate(boards)}
    assert res.returncode == 0, res.stderr[-3000:]
    report = json.loads(res.stdout)
    assert sorted(report["succeeded"]) == sorted(names), report.get("failed")
    site = report["sites"]["lab"]
    release = site["workstation_bytes"]
    print(f"\nrelease {release / 1e6:.1f} MB; the uplink carried {sent / 1e6:.1f} MB for 4 boards "
          f"({sent / release:.2f} releases; 3 in the site, 1 outside); the seed sent {seed_sent / 1e6:.1f} MB on "
          "the LAN; pulls: "
          + ", ".join(f"{m}: {r['bytes'] / 1e6:.1f} MB in {r['seconds']} s" for m, r in site["boards"].items()))
    assert site["seed"] == names[0] and release > 10e6
    for m in names[1:3]:  # the seed's neighbours took everything over the site, nothing from the workstation
        assert site["boards"][m]["missing"] == [] and site["boards"][m]["bytes"] >= 0.9 * release
        assert set(site["boards"][m]["sources"]) == {f"http://{lan.address(0)}:8089"}
    assert 2 * release <= sent <= 2 * release + 12e6  # the seed's copy, the outsider's, and SSH/Ansible's own bytes
    assert seed_sent >= 2 * 0.9 * release  # the neighbours' copies crossed the bridge from the seed
    assert not any(wrong.values()), wrong  # each serves a checked release, every blob holding its bytes


def _largest_blob(board) -> str:  # type: ignore[no-untyped-def]
    rid = os.readlink(board.base / "current").removeprefix("releases/")
    files = json.loads((board.base / "releases" / rid / "release.json").read_text())["files"]
    return max(files.values(), key=lambda f: f["size"])["sha256"]


def _rollout(env: dict[str, str], recipe: str) -> dict:
    res = edgekit("--json", "fleet", "rollout", "--recipe", recipe, "--group", "faultsite", "--no-canary", env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout)


def _variant(tmp: Path, n: int) -> str:
    import yaml

    data = yaml.safe_load((REPO / "edgekit/data/recipes/sim-tiny-mtp.yaml").read_text())
    data["runtime"]["draft_n_max"] = n  # a new release of the same models
    (tmp / f"v{n}.yaml").write_text(yaml.safe_dump(data))
    return str(tmp / f"v{n}.yaml")


@tools
def test_a_seed_poisoned_at_rest_or_killed_mid_rollout_leaves_every_board_correct(
        sim_session, env: dict[str, str], tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Rollout-level faults: the seed's stored copy of the model corrupted at rest (it is hashed again before it is
    served, and sent anew), then the seed's nginx killed as it starts (the first neighbour gets its blobs from the
    workstation, the second, in the playbook's next batch, from the first). Each time the neighbours lack the
    model, as new boards would."""
    boards = sim_session.boards(3, fresh=True)
    board_file = Boards(Path(env["EDGEKIT_CONFIG"]))
    data = board_file.load()
    for b in boards:
        data.boards[b.name] = data.boards[b.name].model_copy(
            update={"site": "faultsite", "site_host": "127.0.0.1", "site_port": free_port()})
    data.groups["faultsite"] = [b.name for b in boards]
    board_file.save(data)
    seed, neighbours = boards[0], boards[1:]
    _rollout(env, "sim-tiny-mtp")
    model = _largest_blob(seed)

    def lose_model() -> None:  # the neighbours never had it; the release they serve keeps its own files
        for b in neighbours:
            (b.base / "store" / model).unlink()

    # 1. A byte flipped in the seed's stored copy, at rest (a new file: the serving release keeps its own).
    lose_model()
    good = (seed.base / "store" / model).read_bytes()
    bad = seed.base / "store" / f"{model}.bad"
    bad.write_bytes(good[:4096] + bytes([good[4096] ^ 0xFF]) + good[4097:])
    os.replace(bad, seed.base / "store" / model)
    # And a server a killed edgekit left running on a neighbour (the playbook outlives edgekit): stopped by this one.
    runner = LocalRunner("left")
    left = Job(runner, agent_ship.ensure(runner, str(neighbours[0].base)), f"{neighbours[0].base}/site/http-left00/job",
               "nginx")
    left.launch(["sleep", "600"])
    assert left.pid is not None and left.poll(0.1) == "running"
    report = _rollout(env, _variant(tmp_path, 2))
    assert left.poll(0.1) != "running" and not (neighbours[0].base / "site" / "http-left00").exists()
    site = report["sites"]["faultsite"]
    print(f"\npoisoned at rest: {site['notes']}; pulls {site['boards']}")
    assert site["seed"] == seed.name and any("did not match their sha256" in n for n in site["notes"])
    assert all(site["boards"][b.name]["missing"] == [] for b in neighbours)  # taken from the mended seed
    assert sorted(report["succeeded"]) == sorted(b.name for b in boards)
    for b in boards:
        assert faults.violations(b) == []

    # 2. The seed's nginx killed the moment it starts.
    lose_model()
    stop = threading.Event()

    def kill_seed_nginx() -> None:
        while not stop.is_set():
            for p in psutil.process_iter(["name", "cmdline"]):
                with contextlib.suppress(psutil.Error):
                    if p.info["name"] == "nginx" and f"{seed.base}/site/" in " ".join(p.info["cmdline"] or []):
                        os.killpg(os.getpgid(p.pid), signal.SIGKILL)  # master and workers: the seed is gone
            time.sleep(0.01)

    killer = threading.Thread(target=kill_seed_nginx, daemon=True)
    killer.start()
    try:
        report = _rollout(env, _variant(tmp_path, 1))
    finally:
        stop.set()
        killer.join(5)
    site = report["sites"]["faultsite"]
    print(f"seed's nginx killed: seed {site['seed']}, notes {site['notes']}, pulls {site['boards']}")
    assert sorted(report["succeeded"]) == sorted(b.name for b in boards) and not report["failed"]
    # Nobody got anything from the dead seed: the workstation sent the model to the first neighbour (or to a seed
    # that took over), and the second neighbour, a batch later, took it from the first, which had finished.
    assert all(f":{data.boards[seed.name].site_port}" not in src
               for r in site["boards"].values() for src in r.get("sources") or {})
    second = site["boards"][neighbours[1].name]
    assert any(f":{data.boards[neighbours[0].name].site_port}" in src for src in second["sources"]), second
    for b in boards:
        assert faults.violations(b) == []
        # the servers are stopped and their run dirs (and the seed's hold on what it served) gone with them
        assert not list((b.base / "site").glob("http-*")), list((b.base / "site").iterdir())
    assert not [p.pid for p in psutil.process_iter(["name", "cmdline"]) if p.info["name"] == "nginx"
                and any(f"{b.base}/site/" in " ".join(p.info["cmdline"] or []) for b in boards)]
    data = board_file.load()
    data.groups.pop("faultsite", None)
    for b in boards:
        data.boards[b.name] = data.boards[b.name].model_copy(update={"site": None})
    board_file.save(data)
