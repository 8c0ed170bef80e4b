"""Emulated aarch64 Jetson boards: the release a Jetson of that profile gets, pushed, started, checked,
benchmarked and rolled back, running under qemu-user through the board's own exec.

The CPU-only aarch64 cross build serves these tests (≈ 5 min cold, then cached); the CUDA cross
build on an emulated board is the `slow` test at the end (`pytest -m slow`, ≈ 14 min cold per SM).
"""

from __future__ import annotations

import json
import os
import subprocess
import urllib.request
from pathlib import Path

import psutil
import pytest
import yaml
from build_helpers import sdist_or_skip
from cli_helpers import edgekit

from edgekit.bench import results
from edgekit.build import patches
from edgekit.build.elf import read_header
from edgekit.config.boardfile import Boards
from edgekit.sim import boards as sim
from edgekit.sim import state as sim_state
from edgekit.sim.testing import SimBoard

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.aarch64_release


def ok_json(res: subprocess.CompletedProcess) -> dict:
    assert res.returncode == 0, (res.stdout[-3000:], res.stderr[-3000:])
    return json.loads(res.stdout)


@pytest.fixture
def env(sim_session) -> dict[str, str]:
    return {**os.environ, **sim_session.env, "EDGEKIT_LLAMA_SRC": str(sdist_or_skip())}


def server_process(board: SimBoard) -> psutil.Process:
    """The board's running llama-server (under its systemctl stand-in's supervisor)."""
    st = sim_state.load(board.dir.parent)
    assert st is not None
    for pid in sim.services(st.boards[board.name]).values():
        for proc in psutil.Process(pid).children(recursive=True):
            if any("llama-server" in part for part in proc.cmdline()):
                return proc
    raise AssertionError(f"no llama-server runs on {board.name}")


def completion(url: str, **extra: object) -> dict:
    body = json.dumps({"prompt": "The quick brown fox", "n_predict": 16, "temperature": 0.0, "top_k": 1,
                       "cache_prompt": False, **extra}).encode()
    req = urllib.request.Request(url, body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as resp:
        return json.loads(resp.read())


def variant(tmp: Path, name: str, **runtime: object) -> Path:
    data = yaml.safe_load((REPO / "edgekit" / "data" / "recipes" / "sim-tiny-mtp.yaml").read_text())
    data["name"] = name
    data["runtime"].update(runtime)
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_an_emulated_orin_runs_the_aarch64_release_end_to_end(sim_session, env, tmp_path: Path) -> None:
    (board,) = sim_session.boards(1, "orin", fresh=True, arch="aarch64")
    assert board.run("uname -m").stdout.strip() == "aarch64"
    first = ok_json(edgekit("--json", "deploy", "--board", board.name, "--recipe", "sim-tiny-mtp", env=env,
                            timeout=1500))
    assert first["build"]["target"] == "orin-cpu"  # no GPU driver on the board: its CPU build
    health = first["health"]
    assert health["ok"] and health["acceptance"] > 0.2 and health["gpu"] is None, health
    # The bytes a Jetson gets: the release's server is an aarch64 ELF, and the process serving it is
    # qemu-aarch64 (binfmt_misc of the board's namespace), started by path by the board's systemctl.
    release = board.base / "releases" / first["release"]
    assert read_header(release / "bin" / "llama-server").machine == "aarch64"
    proc = server_process(board)
    assert os.path.basename(proc.exe()).startswith("qemu-aarch64"), proc.exe()
    assert str(release / "bin" / "llama-server") in " ".join(proc.cmdline())
    # edgekit's llama.cpp patches are in the aarch64 build: the probe names them, and the served server takes a
    # request's speculative.n_max (patch 0001: 0 drafts nothing for that request; the next drafts again)
    probe = ok_json(edgekit("--json", "board", "probe", "--board", board.name, env=env, timeout=120))
    assert probe["llama_patches"] == [f"{p.name}\tapplied" for p in patches.series()]
    url = f"http://127.0.0.1:{board.service_port}/completion"
    drafted, off, again = (completion(url, **extra) for extra in ({}, {"speculative.n_max": 0}, {}))
    assert drafted["timings"]["draft_n"] > 0 and not off["timings"].get("draft_n") and again["timings"]["draft_n"] > 0
    assert drafted["content"] == off["content"] == again["content"]

    out = tmp_path / "bench"
    doc = ok_json(edgekit("--json", "bench", "--board", board.name, "--recipe", "sim-tiny-mtp", "--quick",
                          "--out", str(out), env=env, timeout=1500))
    results.validate(doc)
    assert doc["power"]["available"] and doc["power"]["total_energy_joules"] > 0
    assert {r["config"] for r in doc["runs"]} == {"baseline", "drafter"}
    assert all(r["power"]["joules_per_token"] > 0 for r in doc["runs"])
    assert doc["summary"]["headline"]["acceptance"] > 0.2

    # A changed setting is a new release; rollback brings the first back, healthy, under qemu again.
    second = ok_json(edgekit("--json", "deploy", "--board", board.name, "--recipe",
                             str(variant(tmp_path, "sim-tiny-mtp", draft_n_max=2)), env=env, timeout=1500))
    assert second["changed"] and second["release"] != first["release"]
    back = ok_json(edgekit("--json", "rollback", "--board", board.name, env=env, timeout=1500))
    assert back["release"] == first["release"] and back["health"]["ok"]
    assert os.path.basename(server_process(board).exe()).startswith("qemu-aarch64")


def test_a_fleet_of_an_x86_and_an_emulated_board_gives_each_its_own_build(sim_session, env) -> None:
    (x86,) = sim_session.boards(1, "orin", fresh=True)
    (arm,) = sim_session.boards(1, "orin", fresh=True, arch="aarch64")
    file = Boards(Path(sim_session.env["EDGEKIT_CONFIG"]))
    data = file.load()
    data.groups["mixed-arch"] = [x86.name, arm.name]
    file.save(data)
    report = ok_json(edgekit("--json", "fleet", "rollout", "--recipe", "sim-tiny-mtp", "--group", "mixed-arch",
                             "--batch", "100%", "--no-canary", env=env, timeout=1500))
    assert set(report["succeeded"]) == {x86.name, arm.name}, report
    machines = {b.name: read_header(b.base / "current" / "bin" / "llama-server").machine for b in (x86, arm)}
    assert machines == {x86.name: "x86_64", arm.name: "aarch64"}
    assert report["succeeded"][x86.name]["release"] != report["succeeded"][arm.name]["release"]


def test_a_board_whose_glibc_is_older_than_the_binaries_gets_nothing(sim_session, env) -> None:
    (board,) = sim_session.boards(1, "orin", fresh=True, arch="aarch64")
    st = sim_state.load(board.dir.parent)
    assert st is not None
    getconf = st.boards[board.name].bin_dir / "getconf"  # the board's own glibc, as it reports it
    getconf.write_text("#!/bin/sh\necho 'glibc 2.17'\n")
    getconf.chmod(0o755)
    res = edgekit("deploy", "--board", board.name, "--recipe", "sim-tiny-mtp", env=env, timeout=1500)
    assert res.returncode != 0
    assert "has glibc 2.17" in res.stderr and "nothing was sent" in res.stderr, res.stderr[-2000:]
    assert "Traceback" not in res.stderr
    store = board.base / "store"
    assert not store.exists() or not any(store.iterdir()), "blobs were sent to a board that cannot run them"


@pytest.mark.slow
def test_the_cuda_cross_build_starts_on_an_emulated_orin_and_says_the_gpu_was_not_used(sim_session, env) -> None:
    # JetPack 7.2 (CUDA 13.2): the sm_87 cross build with PyPI's CUDA 13 toolchain, the exact bytes an
    # Orin on JetPack 7.2 gets; the emulated board has the CUDA runtime but no GPU driver.
    (board,) = sim_session.boards(1, "orin", fresh=True, arch="aarch64", jetpack="7.2")
    report = ok_json(edgekit("--json", "deploy", "--board", board.name, "--recipe", "sim-tiny-mtp",
                             "--cuda", "on", timeout=3600, env=env))
    assert report["build"]["target"] == "orin-cuda87"
    verify = report["build"]["verify"]
    assert {a for per in verify["cubins"].values() for a in per} == {"sm_87"}, verify["cubins"]
    health = report["health"]
    assert health["ok"] and health["gpu"].startswith("not used: CUDA driver version is insufficient"), health
    assert health["acceptance"] > 0.2
