"""Board state next to power: clocks, temperatures, nvpmodel, wait-cool; each optional."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
from test_agent_support import run_agent, thermal, write_atomic

from edgekit.agent import extras
from edgekit.agent.fs import ROOT_ENV


def _board(root: Path) -> None:
    for c, khz in enumerate([729600, 2201600, 1113600]):
        f = root / f"sys/devices/system/cpu/cpu{c}/cpufreq/scaling_cur_freq"
        f.parent.mkdir(parents=True)
        f.write_text(f"{khz}\n")
    (root / "sys/devices/system/cpu/cpu3").mkdir()  # offline core: no cpufreq directory
    for node, hz in (("17000000.gpu", 1300500000), ("gpu-gpc-0", 1575000000), ("3d00000.emc", 2133000000)):
        dev = root / "sys/devices/platform" / node / "devfreq" / node
        dev.mkdir(parents=True)
        (dev / "cur_freq").write_text(f"{hz}\n")
        link = root / "sys/class/devfreq" / node
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(dev)
    thermal(root, {"cpu-thermal": 45.5, "cv0-thermal": -256.0, "tj-thermal": 47.25})
    (root / "etc").mkdir()
    (root / "etc/nvpmodel.conf").write_text("< POWER_MODEL ID=0 NAME=MAXN >\n< POWER_MODEL ID=2 NAME=30W >\n")
    (root / "var/lib/nvpmodel").mkdir(parents=True)
    (root / "var/lib/nvpmodel/status").write_text("pmode:0002 fmode:quiet\n")


def test_snapshot_reads_what_is_there(tmp_path: Path) -> None:
    root = tmp_path / "root"
    _board(root)
    res = run_agent(["snapshot", "--source", "none"], root)
    assert res.returncode == 0, res.stderr
    snap = json.loads(res.stdout)
    assert snap["cpu_mhz"] == {"cpu0": 729.6, "cpu1": 2201.6, "cpu2": 1113.6}
    assert snap["gpu_mhz"] == {"17000000.gpu": 1300.5, "gpu-gpc-0": 1575.0}  # the EMC is not a GPU
    assert snap["temperatures_c"] == {"cpu-thermal": 45.5, "tj-thermal": 47.25}  # -256 °C: sensor off
    assert snap["nvpmodel"] == {"id": 2, "name": "30W", "via": "/var/lib/nvpmodel/status"}
    assert snap["power"]["power"] == "unavailable"
    assert snap["clocks_locked"] is None  # no min/max frequencies to compare


def test_clocks_are_locked_when_every_minimum_is_the_maximum(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "root"
    _board(root)
    monkeypatch.setenv(ROOT_ENV, str(root))
    freq = root / "sys/devices/system/cpu"
    gpu = root / "sys/devices/platform/17000000.gpu/devfreq/17000000.gpu"
    for c in range(3):
        (freq / f"cpu{c}/cpufreq/scaling_max_freq").write_text("2201600\n")
        (freq / f"cpu{c}/cpufreq/scaling_min_freq").write_text("729600\n")  # schedutil's floor: not locked
    (gpu / "max_freq").write_text("1300500000\n")
    (gpu / "min_freq").write_text("1300500000\n")
    assert extras.clocks_locked() is False
    for c in range(3):  # what jetson_clocks does
        (freq / f"cpu{c}/cpufreq/scaling_min_freq").write_text("2201600\n")
    assert extras.clocks_locked() is True


def test_nvpmodel_command_wins_when_present(tmp_path: Path) -> None:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "nvpmodel").write_text("#!/bin/sh\necho 'NV Power Mode: MAXN'\necho 0\n")
    (bindir / "nvpmodel").chmod(0o755)
    res = run_agent(["snapshot", "--source", "none"], tmp_path, path_prefix=bindir)
    assert json.loads(res.stdout)["nvpmodel"] == {"id": 0, "name": "MAXN", "via": "nvpmodel -q"}


def test_wait_cool_waits_for_the_temperature_to_drop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "root"
    thermal(root, {"cpu-thermal": 70.0, "tj-thermal": 72.0})
    monkeypatch.setenv(ROOT_ENV, str(root))
    tj = root / "sys/devices/virtual/thermal/thermal_zone1/temp"

    def cool_down() -> None:
        time.sleep(0.6)
        write_atomic(tj, "49000\n")
        write_atomic(root / "sys/devices/virtual/thermal/thermal_zone0/temp", "48000\n")

    t = threading.Thread(target=cool_down)
    t.start()
    res = extras.wait_cool(50.0, timeout_s=10, poll_s=0.1)
    t.join()
    assert res["cooled"] is True and res["temp_c"] == 49.0 and res["start_temp_c"] == 72.0
    assert 0.5 <= res["waited_s"] < 5
    assert extras.wait_cool(40.0, timeout_s=0.3, poll_s=0.1)["cooled"] is False
    assert extras.wait_cool(99.0, timeout_s=1, zone="gpu-thermal")["cooled"] is None  # no such zone


def test_wait_cool_cli_exit_codes(tmp_path: Path) -> None:
    root = tmp_path / "root"
    thermal(root, {"tj-thermal": 60.0})
    assert run_agent(["wait-cool", "--below", "70", "--timeout", "1"], root).returncode == 0
    res = run_agent(["wait-cool", "--below", "50", "--timeout", "0.5", "--poll", "0.1"], root)
    assert res.returncode == 1 and json.loads(res.stdout)["cooled"] is False
    res = run_agent(["wait-cool", "--below", "50", "--timeout", "0.5"], tmp_path / "bare")
    assert res.returncode == 0 and json.loads(res.stdout)["cooled"] is None
