"""`edgekit bench` / `edgekit tune` end to end on simulated boards (real sshd, real llama-server).

* Orin NX board with a scripted power trace: schema-valid results with both configurations and
  acceptance, plots written, and every window's energy within 1 % of the trace's own integral.
* AGX Orin board: Ctrl-C leaves the service as it was; without any power source the bench still
  runs and says so; tune sweeps, shows its table and deploys a new release (total = sum of rails).
"""

from __future__ import annotations

import glob
import hashlib
import itertools
import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest
import yaml
from build_helpers import sdist_or_skip
from cli_helpers import EDGEKIT, edgekit

from edgekit.bench import plots, results
from edgekit.release.memory import MemoryNeed, kv_of_manifest, models_mb
from edgekit.resources import builtin_recipes_dir
from edgekit.sim.testing import SimBoard

RECIPE = "sim-tiny-mtp"
UNIT = "etc/systemd/system/edgekit-serve.service"
BENCH_UNIT = "etc/systemd/system/edgekit-bench.service"


@pytest.fixture(scope="module")
def env(sim_session) -> dict[str, str]:  # type: ignore[no-untyped-def]
    return {**os.environ, **sim_session.env, "EDGEKIT_LLAMA_SRC": str(sdist_or_skip())}


def _deployed(sim_session, env: dict[str, str], profile: str) -> SimBoard:  # type: ignore[no-untyped-def]
    (board,) = sim_session.boards(1, profile, fresh=True)  # fresh: nobody else's load on its rails
    res = edgekit("--json", "deploy", "--board", board.name, "--recipe", RECIPE, env=env, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    return board


@pytest.fixture(scope="module")
def agx(sim_session, env: dict[str, str]) -> SimBoard:  # type: ignore[no-untyped-def]
    return _deployed(sim_session, env, "orin")


def _service(board: SimBoard) -> tuple[bool, str, str, str]:
    """(unit active, unit file sha256, current, serving): what "as it was" means."""
    active = board.run("systemctl is-active --quiet edgekit-serve.service").rc == 0
    sha = hashlib.sha256((board.root / UNIT).read_bytes()).hexdigest()
    return active, sha, os.readlink(board.base / "current"), (board.base / "serving").read_text().strip()


def _leftovers(board: SimBoard) -> list[str]:
    """Processes still running from a bench work dir of this board."""
    mark = f"{board.base}/bench/"
    found = []
    for p in psutil.process_iter(["cmdline", "status"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if mark in cmd and p.info["status"] != psutil.STATUS_ZOMBIE:
            found.append(cmd[:200])
    return found


def _assert_board_as_it_was(board: SimBoard, before: tuple[bool, str, str, str]) -> None:
    assert _service(board) == before
    assert not (board.root / BENCH_UNIT).exists()
    assert not list((board.base / "bench").glob("*")) if (board.base / "bench").exists() else True
    assert not _leftovers(board)


# ------------------------------------------------------------------------- known power integral

def _trace_integral(points: list[tuple[float, float]], start: float, a: float, b: float) -> float:
    """∫ of the piecewise-linear trace (held flat outside its points) over wall-clock [a, b], in J."""
    def w(t: float) -> float:
        if t <= points[0][0]:
            return points[0][1]
        for (t0, w0), (t1, w1) in itertools.pairwise(points):
            if t <= t1:
                return w0 + (w1 - w0) * (t - t0) / (t1 - t0)
        return points[-1][1]

    knots = sorted({a - start, b - start, *(t for t, _ in points if a - start < t < b - start)})
    return sum((t1 - t0) * (w(t0) + w(t1)) / 2 for t0, t1 in itertools.pairwise(knots))


@pytest.fixture
def traced_nx(sim_session, env: dict[str, str]) -> Iterator[tuple[SimBoard, list[tuple[float, float]], float]]:  # type: ignore[no-untyped-def]
    board = _deployed(sim_session, env, "orin-nx-16gb")
    # Slow ramps (≤ 0.1 W/s): the sim writes at 20 Hz and the sampler reads at 20 Hz, unsynchronised.
    points = [(0.0, 5.0), (40.0, 9.0), (80.0, 6.0), (140.0, 8.5), (900.0, 8.5)]
    start = time.time()
    trace = board.dir / "power_trace.json"
    trace.write_text(json.dumps({"start": start, "points": points}))
    try:
        yield board, points, start
    finally:
        trace.unlink(missing_ok=True)


def test_bench_results_plots_and_the_known_power_integral(traced_nx, env: dict[str, str], tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    board, points, start = traced_nx
    before = _service(board)
    out = tmp_path / "out"
    # 400 tokens a request: windows long enough for ≥ 3 samples at 20 Hz on a fast CPU too.
    res = edgekit("--json", "bench", "--board", board.name, "--recipe", RECIPE, "--quick", "--n-gen", "400",
                  "--ignore-eos", "--out", str(out), env=env, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    doc = json.loads(res.stdout)
    results.validate(doc)
    results.validate(json.loads((out / "results.json").read_text()))
    _assert_board_as_it_was(board, before)
    assert doc["service"]["before"] == doc["service"]["after"] and doc["service"]["before"]["active"]

    # Both configurations, alternated, with acceptance measured where there is a drafter.
    assert doc["settings"]["order"] == ["drafter", "baseline"]
    assert [r["config"] for r in doc["runs"]][:4] == ["drafter", "drafter", "baseline", "baseline"]
    for run in doc["runs"]:
        assert run["errors"] == 0 and run["tokens"] == run["requests"] * 400 and run["tokens_per_second"] > 0
        assert run["ttft_p50_s"] > 0
        if run["config"] == "drafter":
            assert run["draft_n"] > 0 and run["acceptance"] > 0.1  # the recipe's drafter is aligned
            assert set(run["acceptance_by_category"]) == {"code", "qa", "chat", "math", "repetitive"}
        else:
            assert run["draft_n"] == 0 and run["acceptance"] is None
    assert doc["summary"]["speedups"] and "drafter" in doc["summary"]["headline"]["text"]
    # Where the drafter wins: over all requests and per category, at each point, each from the paired runs.
    where = doc["summary"]["drafter_map"]
    assert {r["category"] for r in where} == {"all", "code", "qa", "chat", "math", "repetitive"}
    assert all(r["speedup"]["n"] == 2 and r["verdict"] in ("wins", "loses", "tie") for r in where)
    overall = {(r["concurrency"], r["context_length"]): r["speedup"] for r in where if r["category"] == "all"}
    assert overall == {(u["concurrency"], u["context_length"]): u["speedup"] for u in doc["summary"]["speedups"]}
    assert "## Where the drafter wins" in (out / "report.md").read_text()
    assert doc["llama_bench"] and all("error" not in lb for lb in doc["llama_bench"])
    assert doc["roofline"]["ceiling_tokens_per_second"] > 0 and doc["llama_cpp"]["ref"]

    # Power: every run's window integrates to the trace's own integral (within 1 %), at ≥ 10 Hz.
    power = doc["power"]
    assert power["available"] and power["source"] == "hwmon" and power["total_rail_method"] == "rail:VDD_IN"
    assert power["sampling_rate_hz"] >= 10.0
    mono0, wall0 = power["clock"]["monotonic"], power["clock"]["wall"]

    def expected(t0: float, t1: float) -> float:
        return _trace_integral(points, start, t0 - mono0 + wall0, t1 - mono0 + wall0)

    idle = power["idle_window"]
    assert power["static_power_baseline_watts"] == pytest.approx(
        expected(idle["start"], idle["end"]) / (idle["end"] - idle["start"]), rel=0.01)
    for run in doc["runs"]:
        p = run["power"]
        assert p["available"] and p["sampling_rate_hz"] >= 10.0
        # Long enough to trust: 20 samples at the nominal 20 Hz (a shorter window was run again, longer).
        assert p["duration_s"] >= 1.0 and p["samples_in_window"] >= 12, (p, run["lengthened"])
        if run["lengthened"]:
            assert run["requests"] == run["lengthened"]["requests"] > run["lengthened"]["requests_before"]
        assert p["total_energy_joules"] == pytest.approx(expected(p["window_start"], p["window_end"]), rel=0.01)
        assert p["joules_per_token"] == pytest.approx(p["total_energy_joules"] / run["tokens"])
    assert power["total_energy_joules"] == pytest.approx(sum(r["power"]["total_energy_joules"] for r in doc["runs"]))

    # Data first, then the report and the plots.
    for name in plots.PLOTS:
        assert (out / name).read_bytes()[:4] == b"\x89PNG"
    assert doc["summary"]["headline"]["text"] in (out / "report.md").read_text()
    assert (out / "power.jsonl").stat().st_size > 0


# ------------------------------------------------------------------------------------- Ctrl-C

def _sigint_default() -> None:
    """A background job (`.ci/run &`) starts with SIGINT ignored, and Python keeps an ignored SIGINT: the
    bench would never see the Ctrl-C this test sends. Give the child the default, as a terminal would."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _bench_mid_load(agx: SimBoard, env: dict[str, str], out: Path,
                    preexec_fn: Callable[[], None] | None = None) -> subprocess.Popen[str]:
    """A long bench (400 tokens a request), returned once its first load is streaming."""
    proc = subprocess.Popen([*EDGEKIT, "bench", "--board", agx.name, "--recipe", RECIPE,
                             "--quick", "--n-gen", "400", "--ignore-eos", "--no-llama-bench", "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, preexec_fn=preexec_fn)
    deadline = time.monotonic() + 120
    while not glob.glob(f"{agx.base}/bench/*/jobs/load-0/child"):
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        assert time.monotonic() < deadline, "the load never started"
        time.sleep(0.05)
    time.sleep(0.3)  # mid-run: the bench unit serves, the load streams
    return proc


def test_ctrl_c_stops_the_load_and_leaves_the_service_as_it_was(agx: SimBoard, env: dict[str, str],
                                                               tmp_path: Path) -> None:
    before = _service(agx)
    assert before[0]
    proc = _bench_mid_load(agx, env, tmp_path / "out", _sigint_default)
    assert (agx.root / BENCH_UNIT).exists() and not _service(agx)[0]  # the deployed unit was stopped
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-2000:]
    assert "service is as it was" in err and "Traceback" not in err
    _assert_board_as_it_was(agx, before)
    assert not (tmp_path / "out").exists()  # no results from an interrupted bench


def test_a_bench_killed_mid_run_leaves_the_board_serving_again(agx: SimBoard, env: dict[str, str],
                                                              tmp_path: Path) -> None:
    # SIGKILL: nothing of edgekit runs to put the service back. The agent's guard on the board does, when the
    # killed bench's SSH channel closes: the bench unit stopped, the deployed service started.
    assert _service(agx)[0]
    proc = _bench_mid_load(agx, env, tmp_path / "out")
    assert not _service(agx)[0]  # the deployed unit was stopped for the measurement
    proc.kill()
    proc.communicate(timeout=30)
    t0 = time.monotonic()
    while not _service(agx)[0]:
        assert time.monotonic() - t0 < 60, "the deployed service was not started again after the bench was killed"
        time.sleep(0.1)
    back = time.monotonic() - t0
    assert agx.run("systemctl is-active --quiet edgekit-bench.service").rc != 0
    print(f"bench SIGKILLed mid-run: the board served again {back:.1f} s later")
    ok = edgekit("--json", "deploy", "--board", agx.name, "--recipe", RECIPE, env=env, timeout=600)
    assert ok.returncode == 0 and not json.loads(ok.stdout)["changed"], ok.stderr[-2000:]  # healthy, as it was


def test_a_bench_server_that_dies_mid_load_fails_the_bench_with_its_log(agx: SimBoard, env: dict[str, str],
                                                                        tmp_path: Path) -> None:
    # A crash, as a native engine's segfault would end it: the bench unit is not restarted behind the load's
    # back, the bench says which server stopped and shows its log, and the board serves as it did.
    before = _service(agx)
    proc = _bench_mid_load(agx, env, tmp_path / "out")
    pidfile = agx.root / "run/systemd-sim/edgekit-bench.service.pid"
    servers = psutil.Process(int(pidfile.read_text().split()[0])).children(recursive=True)
    (server,) = [p for p in servers if "llama-server" in p.name()]
    server.kill()
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 2, err[-2000:]
    assert "The bench server (drafter) stopped during the load (drafter" in err, err[-2000:]
    assert "it was killed by SIGKILL. Its last log lines:" in err and "Traceback" not in err, err[-2000:]
    _assert_board_as_it_was(agx, before)


# ------------------------------------------------------------------------------ no power source

def test_a_board_without_power_sensors_still_benchmarks(agx: SimBoard, env: dict[str, str], tmp_path: Path) -> None:
    i2c = agx.root / "sys/bus/i2c/devices"
    aside = i2c.with_name("devices.off")
    before = _service(agx)
    i2c.rename(aside)  # no INA3221 any more; the board has neither jtop nor tegrastats
    try:
        res = edgekit("bench", "--board", agx.name, "--recipe", RECIPE, "--quick", "--concurrency", "1",
                      "--no-llama-bench", "--out", str(tmp_path / "out"), env=env, timeout=600)
    finally:
        aside.rename(i2c)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "Power unavailable" in res.stdout and "power unavailable" in res.stderr
    doc = json.loads((tmp_path / "out" / "results.json").read_text())
    results.validate(doc)
    assert doc["power"]["available"] is False and "hwmon" in doc["power"]["reason"]
    assert all(r["power"]["available"] is False and r["tokens_per_second"] > 0 for r in doc["runs"])
    assert {r["config"] for r in doc["runs"]} == {"drafter", "baseline"}
    assert (tmp_path / "out" / "power_trace.png").exists()
    _assert_board_as_it_was(agx, before)


def test_a_sampled_load_beside_the_greedy_one(agx: SimBoard, env: dict[str, str], tmp_path: Path) -> None:
    res = edgekit("bench", "--board", agx.name, "--recipe", RECIPE, "--quick", "--concurrency", "1",
                  "--temperatures", "0,0.7", "--n-gen", "200", "--ignore-eos", "--no-llama-bench", "--no-power",
                  "--out", str(tmp_path / "out"), env=env, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    doc = json.loads((tmp_path / "out" / "results.json").read_text())
    results.validate(doc)
    runs = doc["runs"]
    assert sorted({(r["config"], r["temperature"]) for r in runs}) == [
        ("baseline", 0.0), ("baseline", 0.7), ("drafter", 0.0), ("drafter", 0.7)]
    for rep in (0, 1):  # each sampled request seeded alike with and without the drafter, anew each repetition
        seeds = {r["config"]: [q["seed"] for q in r["requests_detail"]] for r in runs
                 if r["temperature"] == 0.7 and r["repetition"] == rep}
        assert seeds["drafter"] == seeds["baseline"] and len(set(seeds["drafter"])) == len(seeds["drafter"])
    assert all("seed" not in q for r in runs if r["temperature"] == 0.0 for q in r["requests_detail"])
    drafted = {r["temperature"]: r for r in doc["summary"]["points"] if r["config"] == "drafter"}
    assert all(p["acceptance"] for p in drafted.values())  # the drafter drafted, sampled too
    # Sampling changed what the target verified: the same drafts are not accepted alike.
    assert drafted[0.0]["acceptance"] != drafted[0.7]["acceptance"]
    side = doc["summary"]["sampling"]
    assert [r["temperature"] for r in side] == [0.0, 0.7] and all(r["speedup"]["n"] == 2 for r in side)
    print(f"\n{doc['summary']['headline']['text']}")
    assert "At temperature 0.7:" in doc["summary"]["headline"]["text"]
    assert "## Greedy and sampled" in (tmp_path / "out" / "report.md").read_text()


def test_a_32k_point_where_the_memory_holds_it_and_longer_ones_left_out(agx: SimBoard, env: dict[str, str],
                                                                         tmp_path: Path) -> None:
    manifest = json.loads((agx.base / "current" / "release.json").read_text())
    kv, weights = kv_of_manifest(manifest), models_mb({r: e["size"] for r, e in manifest["files"].items()})
    assert kv is not None and kv.full_per_token > 0 and manifest["model_context"] == 131072  # as the published E2B
    # Its sliding layers hold a window, not the context: they cost less per token than the loose bound says.
    assert kv.swa_per_token > 0 and kv.at(32768, 1) < kv.per_token_upper * 32768
    # The board's other software leaves room for one slot of 32 k tokens and not of 64 k: MemAvailable halfway
    # (the bench stops the deployed service first: what it holds counts as free).
    def need(ctx: int) -> float:
        return MemoryNeed(weights, kv.at(ctx + 32 + 256, 1) / 1e6).total_mb

    frees = weights + kv.at(manifest["runtime"]["ctx_size"], manifest["runtime"].get("parallel") or 1) / 1e6
    available = int((need(32768) + need(65536)) / 2 - frees)
    meminfo = agx.root / "proc" / "meminfo"
    before = meminfo.read_text()
    meminfo.write_text(re.sub(r"MemAvailable:\s+\d+ kB", f"MemAvailable:   {available * 1024} kB", before))
    # One request a run (a prompt set of one category): a 32 k prompt takes the tiny model seconds on one thread.
    default = json.loads((Path(results.__file__).parents[1] / "data" / "prompts" / "default.json").read_text())
    one = tmp_path / "one.json"
    one.write_text(json.dumps({**default, "categories": {"code": default["categories"]["code"][:1]}}))
    recipe = yaml.safe_load((builtin_recipes_dir() / f"{RECIPE}.yaml").read_text())
    recipe["bench"]["prompt_set"] = str(one)
    (tmp_path / f"{RECIPE}.yaml").write_text(yaml.safe_dump(recipe))
    try:
        res = edgekit("bench", "--board", agx.name, "--recipe", str(tmp_path / f"{RECIPE}.yaml"), "--quick",
                      "--concurrency", "1", "--context-lengths", "128,32768,65536,262144", "--n-gen", "32",
                      "--repetitions", "1", "--warmup", "0", "--ignore-eos", "--no-llama-bench", "--no-power",
                      "--out", str(tmp_path / "out"), env=env, timeout=900)
    finally:
        meminfo.write_text(before)
    assert res.returncode == 0, res.stderr[-2000:]
    doc = json.loads((tmp_path / "out" / "results.json").read_text())
    results.validate(doc)
    assert sorted({r["context_length"] for r in doc["runs"]}) == [128, 32768]
    notes = doc["notes"]
    assert "context lengths [262144] left out: the model was trained for 131072 tokens" in notes
    assert any(n.startswith("context length 65536 left out: 1 slot(s) of 65824 tokens need") for n in notes), notes
    long = [r for r in doc["runs"] if r["context_length"] == 32768]
    assert all(r["errors"] == 0 and r["prompt_tokens_mean"] >= 32768 * 0.98 for r in long)
    assert [u["context_length"] for u in doc["summary"]["speedups"]] == [128, 32768]
    assert all(u["decode_speedup"]["mean"] > 0 for u in doc["summary"]["speedups"])
    print("\n" + "; ".join(f"ctx {u['context_length']}: {u['speedup']['mean']:.2f}× "
                           f"(decode alone {u['decode_speedup']['mean']:.2f}×)" for u in doc["summary"]["speedups"]))
    assert (tmp_path / "out" / "speedup_vs_context.png").stat().st_size > 20000  # a curve, not the empty note


def test_a_window_too_short_for_20_power_samples_is_run_again_longer(agx: SimBoard, env: dict[str, str],
                                                                       tmp_path: Path) -> None:
    # 8 tokens a request: a run of the tiny model ends in a few hundredths of a second, one power sample.
    res = edgekit("bench", "--board", agx.name, "--recipe", RECIPE, "--quick", "--concurrency", "1",
                  "--n-gen", "8", "--repetitions", "1", "--no-llama-bench", "--out", str(tmp_path / "out"), env=env,
                  timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    doc = json.loads((tmp_path / "out" / "results.json").read_text())
    results.validate(doc)
    for run in doc["runs"]:
        before = run["lengthened"]
        assert before and before["window_s_before"] * 20 < 20 and run["requests"] == before["requests"], run
        assert run["power"]["duration_s"] >= 1.0 and run["power"]["samples_in_window"] >= 12, run["power"]
    assert "runs were run again with more requests" in (tmp_path / "out" / "report.md").read_text()


# ------------------------------------------------------------------------------------------- tune

def test_tune_shows_its_table_and_deploys_the_best_as_a_new_release(agx: SimBoard, env: dict[str, str],
                                                                   tmp_path: Path) -> None:
    old = _service(agx)[2]
    # 1 and 2 both differ from the deployed draft length (3), so the winner is always a new release.
    # The tiny drafter loses to its target on a CPU: a bar of 0.05× lets a drafted setting be deployed here (the
    # target alone winning is tests/test_spec_auto.py's).
    res = edgekit("tune", "--board", agx.name, "--recipe", RECIPE, "--quick", "--draft-n", "1,2",
                  "--min-gain", "0.05", "--out", str(tmp_path / "tune"), env=env, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "n1-pdef" in res.stdout and "n2-pdef" in res.stdout and "best" in res.stdout  # the table
    result = json.loads((tmp_path / "tune" / "tune.json").read_text())
    names = [r["name"] for r in result["table"]]
    assert names == ["n1-pdef", "n2-pdef", "baseline"]
    assert all(r["tokens_per_second"]["n"] == 2 and r["joules_per_token"] for r in result["table"])
    assert result["best"]["name"] in ("n1-pdef", "n2-pdef") and result["power"]["total_rail_method"] == "sum"
    assert result["best"]["tokens_per_second"]["ci95"] is not None
    deployed = result["deployed"]
    assert deployed["changed"] and deployed["release"] != old.removeprefix("releases/")
    assert f"Deployed as release {deployed['release']}" in " ".join(res.stdout.split())
    current, serving = _service(agx)[2:]
    assert current == f"releases/{deployed['release']}" and serving == deployed["release"]
    manifest = json.loads((agx.base / current / "release.json").read_text())
    args = manifest["server_args"]
    assert args[args.index("--spec-draft-n-max") + 1] == str(result["best"]["draft_n_max"])
    assert (tmp_path / "tune" / f"{RECIPE}.tuned.yaml").exists()


def test_tune_sweeps_the_kv_cache_type_and_serves_the_one_it_chose(agx: SimBoard, env: dict[str, str],
                                                                    tmp_path: Path) -> None:
    """``--kv-types f16,q8_0``: the drafter and the baseline at each KV cache type (the drafter's cache too); the
    chosen type goes into the new release's llama.cpp section and its server's -ctk/-ctv."""
    res = edgekit("tune", "--board", agx.name, "--recipe", RECIPE, "--quick", "--draft-n", "2", "--kv-types",
                  "f16,q8_0", "--min-gain", "0.05", "--out", str(tmp_path / "tune"), env=env, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    result = json.loads((tmp_path / "tune" / "tune.json").read_text())
    rows = {r["name"]: r for r in result["table"]}
    assert list(rows) == ["n2-pdef-kvf16", "baseline-kvf16", "n2-pdef-kvq8_0", "baseline-kvq8_0"]
    assert all(r["tokens_per_second"]["mean"] > 0 for r in rows.values())
    assert rows["n2-pdef-kvq8_0"]["cache_type_k"] == rows["n2-pdef-kvq8_0"]["cache_type_v"] == "q8_0"
    assert rows["n2-pdef-kvq8_0"]["acceptance"] and rows["n2-pdef-kvf16"]["acceptance"]  # both drafted
    best = result["best"]
    manifest = json.loads((agx.base / "releases" / result["deployed"]["release"] / "release.json").read_text())
    assert manifest["runtime"]["llama_cpp"]["cache_type_k"] == best["cache_type_k"]
    args = manifest["server_args"]
    if best["cache_type_k"] == "f16":
        assert "-ctk" not in args
    else:
        assert args[args.index("-ctk") + 1] == best["cache_type_k"]
    res = edgekit("tune", "--board", agx.name, "--recipe", RECIPE, "--quick", "--kv-types", "q3_k", "--no-deploy",
                  env=env)
    assert res.returncode == 2 and "llama.cpp has no KV cache type 'q3_k' to tune" in res.stderr, res.stderr


# ------------------------------------------------------------------------- LiteRT-LM backend

def _litert_available() -> bool:
    from edgekit.convert import litert

    return litert.available()


@pytest.mark.skipif(not _litert_available(), reason="litert-torch / litert-lm-api not installed")
def test_bench_litert_backend_measures_the_mtp_bundle_in_the_same_schema(agx: SimBoard, env: dict[str, str],
                                                                          tmp_path: Path) -> None:
    before = _service(agx)
    out = tmp_path / "lt"
    res = edgekit("--json", "bench", "--board", agx.name, "--recipe", RECIPE, "--backend", "litert-lm",
                  "--quick", "--out", str(out), env=env, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    doc = json.loads(res.stdout)
    results.validate(doc)
    _assert_board_as_it_was(agx, before)
    assert doc["backend"] == "litert-lm" and doc["llama_bench"] == [] and doc["roofline"] is None
    assert "tf_lite_mtp_drafter" in doc["litert"]["model_types"] and doc["litert"]["draft_steps"] == 3
    # the front from this edgekit's agent zipapp (no release carries this bundle yet), under LiteRT-LM's Python
    assert all(c["server_command"][-1] == "litert-front" and c["server_command"][-2].endswith(".pyz")
               for c in doc["configurations"])
    for run in doc["runs"]:
        assert run["errors"] == 0 and run["tokens"] > 0 and run["tokens_per_second"] > 0
        if run["config"] == "drafter":  # LiteRT-LM drafted with the aligned drafter, per verify pass
            assert run["draft_n"] > 0 and 0.1 < run["acceptance"] <= 1.0
        else:
            assert run["draft_n"] == 0 and run["acceptance"] is None
    assert "LiteRT-LM" in (out / "report.md").read_text()


@pytest.mark.skipif(not _litert_available(), reason="litert-torch / litert-lm-api not installed")
def test_bench_litert_backend_refuses_a_board_python_without_litert_lm(agx: SimBoard, env: dict[str, str]) -> None:
    before = _service(agx)
    res = edgekit("bench", "--board", agx.name, "--recipe", RECIPE, "--backend", "litert-lm", "--quick",
                  "--litert-python", "/usr/bin/python3", env=env, timeout=600)
    assert res.returncode == 2 and "cannot import litert_lm" in res.stderr, res.stderr[-2000:]
    _assert_board_as_it_was(agx, before)
