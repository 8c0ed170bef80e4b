"""The agent's jtop path against a stand-in jtop service that speaks jtop's own protocol.

The stand-in (``python tests/test_agent_jtop.py serve ROOT T0 [INTERVAL]``) is jetson-stats 7.2.2's
service reduced to its wire protocol: jtop's own ``JtopManager`` (a multiprocessing manager on
``<root>/run/jtop.sock``, jtop's authkey) exposing ``get_queue`` / ``sync_data`` / ``sync_event``;
it answers a client's ``{'interval': s}`` with ``{'init': ...}`` and then pushes the stats dict every
interval, as ``JtopServer`` does. The power readings follow a scripted trace (AGX Orin's rails; jtop
keeps VIN_SYS_5V0 among the rails and puts an unnamed sum in ``tot``), and every ``avg`` is made
wrong on purpose: the agent must integrate ``power`` only. The jtop *client* is the real one.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_agent_support import (
    RAMP_UNTIL,
    ina3221,
    set_ina3221,
    start_agent,
    step_ramp,
    step_ramp_joules,
    stop_agent,
    wait_for_samples,
)

from edgekit.agent import energy

jtop = pytest.importorskip("jtop", reason="jetson-stats is not installed (pip install jetson-stats==7.2.2)")


def _power(tau: float) -> dict:
    total = step_ramp(tau) * 1000.0  # mW
    rails = {"VDD_GPU_SOC": 2400.0, "VDD_CPU_CV": 800.0, "VIN_SYS_5V0": total}
    rail = {k: {"volt": 5000, "curr": int(v / 5), "power": int(v), "avg": int(v) * 10, "online": True,
                "warn": 0, "crit": 0} for k, v in rails.items()}
    tot = {"power": int(sum(rails.values())), "avg": 1}  # unnamed: AGX Orin has no rail jtop calls total
    return {"rail": rail, "tot": tot}


def serve(root: str, t0: float, forced_interval: float | None = None) -> None:
    """Run the stand-in until SIGTERM; removes its socket and its manager process on the way out."""
    import threading
    from multiprocessing import Event, Queue

    import jtop.service as service
    from jtop.core.common import get_var

    sock = os.path.join(root, "run", "jtop.sock")
    os.makedirs(os.path.dirname(sock), exist_ok=True)
    service.JTOP_PIPE = sock  # JtopManager reads it when constructed
    q, event, data = Queue(), Event(), {}
    service.JtopManager.register("get_queue", callable=lambda: q)
    service.JtopManager.register("sync_data", callable=lambda: data)
    service.JtopManager.register("sync_event", callable=lambda: event)
    manager = service.JtopManager()
    manager.start()
    sync_data, sync_event = manager.sync_data(), manager.sync_event()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())

    def tick() -> None:
        sync_data.update({"uptime": time.monotonic(), "gpu": {}, "mem": {}, "fan": {},
                          "power": _power(time.monotonic() - t0)})
        if not sync_event.is_set():
            sync_event.set()

    def ticker(interval: float) -> None:
        nxt = time.monotonic()
        while not stop.is_set():
            tick()
            nxt += interval
            stop.wait(max(nxt - time.monotonic(), 0.0))

    thread = None
    try:
        while not stop.is_set():
            try:
                control = q.get(timeout=0.2)
            except Exception:  # queue.Empty
                continue
            if not control:
                continue
            if "init" in control:  # a client read the same message back: resend, as jtop does
                q.put(control)
                continue
            if "interval" in control:
                interval = forced_interval or float(control["interval"])
                if thread is None:
                    tick()  # the client wants data as soon as it has its init
                    thread = threading.Thread(target=ticker, args=(interval,), daemon=True)
                    thread.start()
                q.put({"init": {"version": get_var(service.VERSION_RE), "board": {"hardware": {}},
                                "interval": interval, "memory": {}, "fan": {}, "jc": False}})
    finally:
        stop.set()
        manager.shutdown()
        if os.path.exists(sock):
            os.unlink(sock)


@pytest.fixture
def standin(tmp_path: Path):  # type: ignore[no-untyped-def]
    procs: list[subprocess.Popen[str]] = []

    def start(root: Path, t0: float, forced_interval: float | None = None) -> None:
        args = [sys.executable, __file__, "serve", str(root), repr(t0)]
        if forced_interval:
            args.append(repr(forced_interval))
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
        procs.append(proc)
        sock = root / "run" / "jtop.sock"
        deadline = time.monotonic() + 20
        while not sock.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"stand-in jtop service did not start: {proc.communicate()}")
            time.sleep(0.05)

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
        try:
            proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # its own session: the stand-in and its manager only
            proc.communicate()


def test_sampler_uses_jtop_and_integrates_power_not_avg(tmp_path: Path, standin) -> None:  # type: ignore[no-untyped-def]
    root = tmp_path / "root"
    files = ina3221(root, "1-0040", ["VDD_GPU_SOC", "VDD_CPU_CV", "VIN_SYS_5V0"])  # present, but jtop wins
    set_ina3221(files["VIN_SYS_5V0"], 1.0)
    t0 = time.monotonic() + 2.0
    standin(root, t0)
    out = tmp_path / "s.jsonl"
    proc = start_agent(["sample", "--out", str(out), "--hz", "20"], root)
    try:
        wait_for_samples(out, t0 + RAMP_UNTIL + 0.6, proc)
    finally:
        rc, stdout, stderr = stop_agent(proc)
    assert rc == 0, stderr
    assert json.loads(stdout)["source"] == "jtop"
    meta, samples, _ = energy.read_samples(str(out))
    assert meta["source"] == "jtop" and meta["jtop_interval_s"] == pytest.approx(0.05)
    assert meta["total_rail"] == "VIN_SYS_5V0" and meta["total_is_sum"] is False
    assert set(samples[-1]["rails"]) == {"VDD_GPU_SOC", "VDD_CPU_CV", "VIN_SYS_5V0"}
    a, b = t0 + 0.25, t0 + RAMP_UNTIL + 0.5
    win = energy.window_energy(samples, a, b)
    assert win.energy_j == pytest.approx(step_ramp_joules(a - t0, b - t0), rel=0.01)  # `avg` would be 10×
    assert win.sampling_rate_hz is not None and win.sampling_rate_hz >= 10.0


def test_a_slow_jtop_service_is_passed_over_for_hwmon(tmp_path: Path, standin) -> None:  # type: ignore[no-untyped-def]
    root = tmp_path / "root"
    files = ina3221(root, "1-0040", ["VDD_IN"])
    set_ina3221(files["VDD_IN"], 7.0)
    standin(root, time.monotonic(), forced_interval=1.0)  # as if another client had started it at 1 s
    out = tmp_path / "s.jsonl"
    proc = start_agent(["sample", "--out", str(out), "--hz", "20", "--duration", "0.5"], root)
    proc.wait(timeout=30)  # --duration ends it
    rc, _, stderr = stop_agent(proc)
    assert rc == 0, stderr
    meta, samples, _ = energy.read_samples(str(out))
    assert meta["source"] == "hwmon" and "runs every 1 s" in meta["skipped"]["jtop"]
    assert samples[0]["total_mw"] == pytest.approx(7000.0)


if __name__ == "__main__" and sys.argv[1:2] == ["serve"]:
    serve(sys.argv[2], float(sys.argv[3]), float(sys.argv[4]) if len(sys.argv) > 4 else None)
