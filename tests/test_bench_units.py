"""Bench building blocks without a board: statistics, server configurations, total rail, energy
windows, the GGUF roofline, plans, background jobs, and the results document → schema, report, plots."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from types import SimpleNamespace

import gguf
import jsonschema
import numpy as np
import psutil
import pytest

from edgekit.bench import engines as bench_engines
from edgekit.bench import orchestrate, plots, report, results, roofline, stats, workloads
from edgekit.bench.benchunit import ServiceState
from edgekit.bench.jobs import Job, JobFailed
from edgekit.bench.plan import Overrides, make_plan
from edgekit.bench.power import PowerLog, TotalRail, total_rail, window_power
from edgekit.bench.session import BoardRelease, Phase, Run
from edgekit.bench.workloads import Point
from edgekit.config.boardfile import Board
from edgekit.config.profiles import get_profile
from edgekit.config.recipes import load_recipe
from edgekit.engines.llamacpp import bench as serverconf
from edgekit.remote import agent_ship
from edgekit.remote.runner import LocalRunner

RELEASE_ARGS = ["-m", "models/target.gguf", "-c", "512", "-ngl", "0", "-np", "1", "--host", "127.0.0.1", "--port",
                "8080", "-t", "1", "--spec-type", "draft-mtp", "--spec-draft-n-max", "3", "-md", "models/drafter.gguf",
                "-ngld", "0", "--no-webui", "--metrics", "--spec-ngram-simple-size-n", "4"]


# ------------------------------------------------------------------------------------------- stats

def test_ci95_uses_students_t() -> None:
    e = stats.estimate([1.0, 2.0, 3.0])
    assert e is not None and e.mean == 2.0 and e.stdev == pytest.approx(1.0)
    assert e.ci95 == pytest.approx(4.303 / 3 ** 0.5, rel=1e-4)  # t(2) = 4.303, not 1.96
    one = stats.estimate([5.0])
    assert one is not None and one.ci95 is None and one.n == 1
    assert stats.estimate([]) is None
    assert stats.t95(200) == 1.96 and stats.t95(22) == stats.t95(20)  # conservative between table rows
    assert stats.percentile([1, 2, 3, 4], 50) == 2.5 and stats.percentile([3, 1, 2], 95) == pytest.approx(2.9)
    a, b = stats.estimate([10, 11, 12]), stats.estimate([11.5, 12, 12.5])
    assert a is not None and b is not None and a.overlaps(b)
    assert not stats.estimate([1, 1.1, 1.2]).overlaps(stats.estimate([5, 5.1, 5.2]))  # type: ignore[union-attr]


# ------------------------------------------------------------------------------------ server args

def test_baseline_drops_every_speculative_flag() -> None:
    base = serverconf.baseline_args(RELEASE_ARGS)
    assert not any(a.startswith(("--spec", "-md", "-ngld")) for a in base)
    assert "models/drafter.gguf" not in base and "4" not in base[base.index("--metrics"):]
    assert base[:12] == RELEASE_ARGS[:12] and "--no-webui" in base and "--metrics" in base
    assert serverconf.is_speculative(RELEASE_ARGS) and not serverconf.is_speculative(base)


def test_bench_server_gets_port_slots_and_enough_context() -> None:
    args = serverconf.for_bench(RELEASE_ARGS, 9001, parallel=4, slot_ctx=300)
    assert serverconf.get(args, "port") == "9001" and serverconf.get(args, "parallel") == "4"
    assert serverconf.get(args, "ctx") == "1200"  # 4 slots × 300 tokens (512 would give 128 each)
    same = serverconf.for_bench(RELEASE_ARGS, 9001, parallel=1, slot_ctx=300)
    assert serverconf.get(same, "ctx") == "512"  # already enough
    assert serverconf.put(["--spec-draft-n-max=3"], "draft_n_max", 5) == ["--spec-draft-n-max=5"]
    assert serverconf.put([], "draft_p_min", 0.5) == ["--spec-draft-p-min", "0.5"]
    drafter, baseline = serverconf.pair(RELEASE_ARGS, 9001, 2, 64)
    assert (drafter.name, drafter.speculative, baseline.name, baseline.speculative) == (
        "drafter", True, "baseline", False)
    assert drafter.settings["draft_n_max"] == 3 and baseline.settings["spec_type"] == "none"
    assert [c.name for c in serverconf.pair(baseline.args, 9001, None, None)] == ["baseline"]


def test_bench_servers_get_the_environment_the_release_serves_with() -> None:
    # A recipe's runtime.env (an engine switch, a guard's setting) is part of how the release serves: the
    # bench measures that server, for every engine, tune points included.
    board = Board(host="127.0.0.1", user="u", profile="orin-agx-64gb", sim=True)
    env = {"GGML_CUDA_FORCE_MMQ": "1"}
    llama = BoardRelease("llama.cpp", "r1", "/b/releases/r1",
                         {"release": "r1", "recipe": "x", "server_args": RELEASE_ARGS, "runtime": {"env": env}})
    drafter, baseline = bench_engines.configs(llama, board, 9001, 2, 64)
    assert drafter.env == env and baseline.env == env
    assert bench_engines.tune_point(llama, drafter, 2, None).env == env
    args = ["--model", "$RELEASE/models/target", "--port", "8080", "--speculative-config", '{"method":"mtp"}']
    vllm = BoardRelease("vllm", "r2", "/b/releases/r2", {"release": "r2", "recipe": "x", "server_args": args,
                                                     "runtime": {"env": env}})
    assert all(c.env["GGML_CUDA_FORCE_MMQ"] == "1" and c.env["VLLM_NO_USAGE_STATS"] == "1"
               for c in bench_engines.configs(vllm, board, 9001, 2, 64))
    plain = BoardRelease("llama.cpp", "r0", "/b/releases/r0",  # a release from before runtime.env
                         {"release": "r0", "recipe": "x", "server_args": RELEASE_ARGS})
    assert all(c.env == {} for c in bench_engines.configs(plain, board, 9001, 2, 64))


# ------------------------------------------------------------------------------------------ power

def test_total_rail_per_board() -> None:
    agx = total_rail(get_profile("orin-agx-64gb"))
    assert (agx.sampler_arg, agx.method) == ("sum", "sum") and "jetson_stats#344" in agx.note
    assert total_rail(get_profile("orin-nx-16gb")).method == "rail:VDD_IN"
    assert total_rail(get_profile("thor")).sampler_arg == "VIN"
    assert total_rail(get_profile("orin"), "VIN_SYS_5V0").method == "rail:VIN_SYS_5V0"


def _samples(fn, t0: float, t1: float, hz: float = 20.0) -> list[dict]:  # type: ignore[no-untyped-def]
    n = int((t1 - t0) * hz) + 1
    out = []
    for i in range(n):
        t = t0 + i / hz
        w = fn(t)
        out.append({"t": t, "rails": {"VDD_IN": w * 1000, "VDD_SOC": 1000.0}, "total_mw": w * 1000})
    return out


def test_window_power_integrates_the_exact_window() -> None:
    samples = _samples(lambda t: 5.0 + 0.5 * t, 0.0, 20.0)  # a ramp: the trapezoid rule is exact
    p = window_power(samples, 3.03, 7.51, tokens=100, baseline_w=5.0)
    exact = 5.0 * (7.51 - 3.03) + 0.25 * (7.51 ** 2 - 3.03 ** 2)
    assert p["available"] and p["total_energy_joules"] == pytest.approx(exact, rel=1e-6)
    assert p["joules_per_token"] == pytest.approx(exact / 100, rel=1e-6)
    assert p["dynamic_energy_joules"] == pytest.approx(exact - 5.0 * 4.48, rel=1e-5)
    assert p["sampling_rate_hz"] == pytest.approx(20.0) and p["rails_energy_joules"]["VDD_SOC"] == pytest.approx(4.48)
    assert p["window_start"] == 3.03 and p["window_end"] == 7.51
    gone = window_power(samples, 19.0, 25.0, 10, None)
    assert gone["available"] is False and "not covered" in gone["reason"]


def test_power_log_summary_and_unavailable() -> None:
    meta = {"source": "hwmon", "total_rail": "VDD_IN", "rails": ["VDD_IN", "VDD_SOC"], "hz": 20.0,
            "start_t": 0.0, "start_wall": 1000.0}
    log = PowerLog(meta, _samples(lambda t: 4.0, 0.0, 10.0), {"samples": 201})
    log.measure_idle(1.0, 3.0)
    rail = TotalRail("VDD_IN", "rail:VDD_IN", "x")
    s = log.summary(rail, [{"available": True, "total_energy_joules": 2.5}])
    assert s["static_power_baseline_watts"] == pytest.approx(4.0) and s["total_energy_joules"] == 2.5
    assert s["sampling_rate_hz"] == pytest.approx(20.0) and s["clock"] == {"monotonic": 0.0, "wall": 1000.0}
    none = PowerLog({"power": "unavailable", "reasons": {"hwmon": "no INA3221"}}, [], None)
    off = none.summary(rail, [])
    assert off["available"] is False and "no INA3221" in off["reason"]


# --------------------------------------------------------------------------------------- roofline

def _gguf(path: Path, tied: bool) -> None:
    w = gguf.GGUFWriter(str(path), "gemma4")
    w.add_block_count(1)
    w.add_array("tokenizer.ggml.tokens", [f"t{i}" for i in range(300)])
    w.add_tensor("token_embd.weight", np.zeros((300, 64), dtype=np.float32))  # 76,800 B
    w.add_tensor("per_layer_token_embd.weight", np.zeros((300, 128), dtype=np.float16))  # 76,800 B, lookup
    q = gguf.quantize(np.zeros((64, 256), dtype=np.float32), gguf.GGMLQuantizationType.Q4_0)
    w.add_tensor("blk.0.ffn_up.weight", q, raw_dtype=gguf.GGMLQuantizationType.Q4_0)  # 64·256/32·18 = 9,216 B
    if not tied:
        w.add_tensor("output.weight", np.zeros((300, 64), dtype=np.float16))  # 38,400 B
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_roofline_counts_the_bytes_a_decode_step_reads(tmp_path: Path) -> None:
    tied, untied = tmp_path / "tied.gguf", tmp_path / "untied.gguf"
    _gguf(tied, tied=True)
    _gguf(untied, tied=False)
    with tied.open("rb") as fh:
        info = roofline.read_header(fh)
    assert info.arch == "gemma4" and info.total_bytes == 76_800 + 76_800 + 9_216
    assert roofline.bytes_per_token(info)[0] == 76_800 + 9_216  # tied LM head read in full, PLE looked up
    with untied.open("rb") as fh:
        assert roofline.bytes_per_token(roofline.read_header(fh))[0] == 9_216 + 38_400  # embeddings: lookups
    r = roofline.roofline(info, 102.4, measured_tps=1e5, drafter_tps=2e6)
    assert r["ceiling_tokens_per_second"] == pytest.approx(102.4e9 / 86_016, rel=1e-6)
    assert r["measured_fraction"] == pytest.approx(1e5 / r["ceiling_tokens_per_second"], rel=1e-5)
    assert r["drafter_fraction"] > 1  # drafting checks several tokens per pass over the weights
    with pytest.raises(roofline.GGUFError):
        roofline.read_header((tmp_path / "x").open("w+b"))


def test_an_moe_roofline_counts_the_routed_experts_and_the_report_says_so(tmp_path: Path) -> None:
    path = tmp_path / "moe.gguf"
    w = gguf.GGUFWriter(str(path), "gemma4")
    w.add_block_count(1)
    w.add_expert_count(8)
    w.add_expert_used_count(2)
    w.add_tensor("token_embd.weight", np.zeros((300, 64), dtype=np.float32))  # 76,800 B: the tied head
    w.add_tensor("blk.0.ffn_gate_up_exps.weight", np.zeros((8, 64, 64), dtype=np.float32))  # 131,072 B, 2 of 8
    w.add_tensor("blk.0.ffn_down_exps.scale", np.ones(8, dtype=np.float32))  # 32 B, 2 of 8
    w.add_tensor("blk.0.ffn_up.weight", np.zeros((64, 64), dtype=np.float32))  # 16,384 B: the shared MLP
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with path.open("rb") as fh:
        info = roofline.read_header(fh)
    per_token, notes = roofline.bytes_per_token(info)
    assert per_token == 76_800 + (131_072 + 32) // 4 + 16_384 and "experts: 2 of 8 per token" in notes
    text = "\n".join(report._roofline(roofline.roofline(info, 204.8, measured_tps=1000.0)))
    assert "(token_embd counted in full: tied LM head; experts: 2 of 8 per token)" in text, text


# ------------------------------------------------------------------------------------------ plans

def test_quick_plan_is_small_and_slots_follow_concurrency() -> None:
    recipe = load_recipe("e2b-mtp")
    full = make_plan(recipe, Overrides(), quick=False, categories=5)
    assert [(p.concurrency, p.context_length) for p in full.points][:4] == [(1, 128), (2, 128), (4, 128), (8, 128)]
    assert full.parallel == 8 and full.slot_ctx == 32768 + 256 + 256 and full.repetitions == 5
    quick = make_plan(recipe, Overrides(), quick=True, categories=5)
    assert [(p.concurrency, p.context_length) for p in quick.points] == [(1, 128), (8, 128)]
    assert quick.repetitions == 2 and quick.n_gen == 64 and quick.idle_s == 2.0
    assert quick.requests(Point(1, 128)) == 5 and quick.requests(Point(8, 128)) == 8
    assert quick.requests(Point(2, 128)) == 6  # whole rounds of 2, every category asked
    deployed = make_plan(recipe, Overrides(slots="deployed", cooldown_temp_c=None), quick=False, categories=5)
    assert deployed.parallel is None and deployed.cooldown_temp_c is None
    assert any("queues" in n for n in deployed.notes) and any("do not fit" in n for n in deployed.notes)


# ------------------------------------------------------------------------------------------- jobs

def _ours(marker: str) -> list[psutil.Process]:
    return [p for p in psutil.process_iter(["cmdline"]) if marker in " ".join(p.info["cmdline"] or [])]


def test_jobs_report_exit_codes_and_stop_without_leftovers(tmp_path: Path) -> None:
    runner = LocalRunner("here")
    agent = agent_ship.ensure(runner, str(tmp_path))
    done = Job.start(runner, agent, str(tmp_path / "a"), ["sh", "-c", "echo hi; exit 3"], "a job")
    assert done.wait(30, poll_s=0.5) == 3 and done.read().strip() == "hi"
    marker = f"edgekit-test-{os.getpid()}-{time.monotonic_ns()}"
    slow = Job.start(runner, agent, str(tmp_path / "b"), ["sh", "-c", f"sleep 60 # {marker}"], "a slow job")
    assert slow.poll(0.3) == "running" and _ours(marker)
    with pytest.raises(JobFailed, match="ran past"):
        slow.wait(0.5, poll_s=0.2)  # stops it
    deadline = time.monotonic() + 5
    while _ours(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [p for p in _ours(marker) if p.status() != psutil.STATUS_ZOMBIE]


def test_a_job_killed_before_its_exit_code_is_gone_and_says_what_the_board_saw(tmp_path: Path) -> None:
    runner = LocalRunner("here")
    job = Job.start(runner, agent_ship.ensure(runner, str(tmp_path)), str(tmp_path / "k"), ["sleep", "60"],
                    "a doomed job")
    child = int((tmp_path / "k" / "child").read_text())
    assert job.pid is not None
    os.killpg(job.pid, signal.SIGKILL)  # the wrapper and its command, before the wrapper writes rc
    with pytest.raises(JobFailed, match=rf"ended without an exit code \(pid={job.pid} child={child}\)"):
        job.wait(10, poll_s=0.2)


# ------------------------------------------------------------------ the document, schema, plots

def _run(k: int, cfg: str, c: int, rep: int, tps: float, t0: float, temperature: float = 0.0,
         accepted: int = 20) -> Run:
    n = 5
    reqs = [{"i": i, "category": workloads_cat(i), "prompt_index": 0, "prompt_tokens": 130, "start": t0 + i * 0.1,
             "end": t0 + i * 0.1 + 0.5, "latency_s": 0.5, "ttft_s": 0.05, "tokens": 32, "decode_tps": tps,
             "draft_n": 30 if cfg == "drafter" else None, "draft_n_accepted": accepted if cfg == "drafter" else None}
            for i in range(n)]
    dur = n * 32 / tps
    out = {"window": {"start": t0, "end": t0 + dur, "duration_s": dur}, "requests": reqs, "chat_template": True,
           "warmup": {"start": t0 - 0.2}}
    return Run(k, cfg, Point(c, 128, temperature), rep, out, workloads.load_metrics(out), None, 0.5)


def workloads_cat(i: int) -> str:
    return ("code", "qa", "chat", "math", "repetitive")[i % 5]


def fake_document(power: bool, sampled: bool = False) -> dict:
    """Three repetitions at one and two requests; ``sampled``: also at temperature 0.7, where the drafter has
    fewer drafts accepted and a smaller gain."""
    runs, t = [], 10.0
    for rep in range(3):
        for cfg, tps in (("drafter", 150.0 + rep), ("baseline", 100.0 - rep)):
            for temp in (0.0, 0.7) if sampled else (0.0,):
                for c in (1, 2):
                    slower = 0.8 if temp and cfg == "drafter" else 1.0
                    runs.append(_run(len(runs), cfg, c, rep, tps * c * slower, t, temp, 12 if temp else 20))
                    t += 3.0
    meta = {"source": "hwmon", "total_rail": None, "total_is_sum": True, "rails": ["VDD_IN"], "hz": 20.0,
            "start_t": 0.0, "start_wall": 1e9}
    log = PowerLog(meta, _samples(lambda x: 6.0 + (x % 3.0), 0.0, t + 5), None) if power else PowerLog(
        {"power": "unavailable", "reasons": {"hwmon": "no sensors"}}, [], None)
    recipe = load_recipe("sim-tiny-mtp")
    board = Board(host="127.0.0.1", user="u", profile="orin-agx-64gb", sim=True)
    state = ServiceState(True, True, "ab" * 32)
    sess = SimpleNamespace(
        board=board, name="b1", recipe=recipe, facts=None, release="sim-tiny-mtp-0123", manifest={
            "recipe": recipe.name, "spec_type": "draft-mtp", "drafter": True, "build": {"key": "k"}},
        release_args=RELEASE_ARGS, rail=total_rail(get_profile("orin")), power_log=log, service_before=state,
        service_after=state, phases=[Phase("idle", 1.0, 3.0)] + [Phase(f"run {r.index}", *r.window, r.config)
                                                                  for r in runs],
        snapshots={}, cleanup_errors=[], media_runs=[], power_text="",
        opts=SimpleNamespace(exclusive=True, hz=20.0, power=power, raw_prompts=False),
        bench_port=8081)
    plan = make_plan(recipe, Overrides(), quick=False, categories=5)
    info = roofline.GGUFInfo("gemma4", [roofline.Tensor("blk.0.w", 0, 1000, 4000)])
    configs = serverconf.pair(RELEASE_ARGS, 8081, 2, 300)
    lb = [{"test": "tg", "avg_ts": 120.0, "n_gen": 32, "window": {"start": 4.0, "end": 5.0}}]
    return orchestrate.build_document(sess, plan, configs, runs, lb, (1.0, 3.0) if power else None, info,  # type: ignore[arg-type]
                                      orchestrate.BenchOptions())


@pytest.mark.parametrize("power", [True, False])
def test_document_follows_the_schema_and_renders(power: bool, tmp_path: Path) -> None:
    doc = fake_document(power)
    results.validate(doc)
    ups = doc["summary"]["speedups"]
    assert [u["concurrency"] for u in ups] == [1, 2]
    assert ups[0]["speedup"]["values"] == pytest.approx([1.5, 151 / 99, 152 / 98])  # paired per repetition
    assert doc["summary"]["headline"]["text"].startswith("The drafter makes tiny-gemma4-e2b-tuned 1.5")
    drafter = next(p for p in doc["summary"]["points"] if p["config"] == "drafter")
    assert drafter["acceptance"] == pytest.approx(2 / 3) and drafter["acceptance_by_category"]["math"]["draft_n"] == 90
    if power:
        assert doc["power"]["total_rail_method"] == "sum" and doc["power"]["static_power_baseline_watts"] is not None
        assert doc["runs"][0]["power"]["joules_per_token"] > 0 and ups[0]["energy_ratio"] is not None
        assert doc["llama_bench"][0]["power"]["joules_per_token_estimate"] > 0
    else:
        assert doc["power"]["available"] is False and "no sensors" in doc["power"]["reason"]
        assert all(r["power"]["available"] is False for r in doc["runs"])
    files = orchestrate.write(doc, tmp_path)
    for name in plots.PLOTS:
        data = (tmp_path / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
    text = (tmp_path / "report.md").read_text()
    assert doc["summary"]["headline"]["text"] in text and "![power_trace](power_trace.png)" in text
    assert ("Power unavailable" in text) is (not power)
    results.validate(json.loads(Path(files["results"]).read_text()))
    assert report.render(doc).startswith("# sim-tiny-mtp on b1")


def test_greedy_and_sampled_load_are_reported_side_by_side(tmp_path: Path) -> None:
    from edgekit.history.metrics import metrics_from_results

    doc = fake_document(power=True, sampled=True)
    results.validate(doc)
    ups = doc["summary"]["speedups"]
    assert [(u["concurrency"], u["temperature"]) for u in ups] == [(1, 0.0), (2, 0.0), (1, 0.7), (2, 0.7)]
    greedy, sampled = ups[0]["speedup"]["values"], ups[2]["speedup"]["values"]
    assert sampled == pytest.approx([0.8 * g for g in greedy])  # paired within each temperature, not across
    assert ups[2]["decode_speedup"]["values"] == pytest.approx(sampled)  # every request decodes at the run's rate
    side = doc["summary"]["sampling"]
    assert [(r["concurrency"], r["temperature"]) for r in side] == [(1, 0.0), (1, 0.7), (2, 0.0), (2, 0.7)]
    assert [r["acceptance"] for r in side[:2]] == pytest.approx([20 / 30, 12 / 30])
    head = doc["summary"]["headline"]["text"]
    assert head.startswith("The drafter makes tiny-gemma4-e2b-tuned 1.5") and "67% of drafted tokens accepted" in head
    assert "At temperature 0.7: 1.2" in head and "40% accepted" in head
    assert doc["summary"]["headline"]["temperature"] == 0.0
    assert {(r["category"], r["temperature"]) for r in doc["summary"]["drafter_map"]} >= {("all", 0.0), ("all", 0.7)}
    orchestrate.write(doc, tmp_path)
    text = (tmp_path / "report.md").read_text()
    assert "## Greedy and sampled" in text and "| conc. | ctx | T=0 | T=0.7 |" in text
    assert "| 1 | 128 T=0.7 |" in text  # the speedup table tells the sampled rows apart
    for name in plots.PLOTS:
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # A nightly history keeps greedy series under their old names; a sampled point is a series of its own.
    series = {m.config for m in metrics_from_results(doc)}
    assert {"drafter", "baseline", "drafter T0.7", "baseline T0.7"} <= series
    greedy_only = fake_document(power=False)
    assert "sampling" not in greedy_only["summary"] and "temperature" not in greedy_only["summary"]["headline"]["text"]


def test_a_plan_has_a_point_per_temperature() -> None:
    recipe = load_recipe("e2b-mtp")
    plan = make_plan(recipe, Overrides(concurrency=[1], context_lengths=[128], temperatures=[0.7, 0.0]), quick=False,
                     categories=5)
    assert [(p.concurrency, p.temperature) for p in plan.points] == [(1, 0.0), (1, 0.7)]
    assert plan.points[1].label() == "c=1 ctx=128 T=0.7" and plan.points[0].label() == "c=1 ctx=128"
    assert plan.to_json()["points"][1] == {"concurrency": 1, "context_length": 128, "temperature": 0.7}
    argv = workloads.load_argv("py", "agent", 1, "p", plan.points[1], 5, 8, 0, 0, False, "o", "l")
    assert argv[argv.index("--temperature") + 1] == "0.7"
    assert "--temperature" not in workloads.load_argv("py", "agent", 1, "p", plan.points[0], 5, 8, 0, 0, False,
                                                      "o", "l")
    sampled = recipe.model_copy(update={"bench": recipe.bench.model_copy(update={"temperatures": [0.0, 0.7]})})
    assert len(make_plan(sampled, Overrides(concurrency=[1]), quick=True, categories=5).points) == 1


def test_schema_rejects_power_without_its_fields() -> None:
    doc = fake_document(True)
    del doc["power"]["static_power_baseline_watts"]
    with pytest.raises(jsonschema.ValidationError, match="static_power_baseline_watts"):
        results.validate(doc)
    doc = fake_document(True)
    del doc["runs"][0]["power"]["window_start"]
    with pytest.raises(jsonschema.ValidationError):
        results.validate(doc)


def test_media_probes_are_summarised_per_configuration_and_kind() -> None:
    probe = {"ok": True, "prompt_tokens": 111, "tokens": 16}
    probes = [
        {**probe, "config": "drafter", "kind": "image", "rep": 0, "ttft_ms": 20.0, "tokens_per_second": 4000.0,
         "draft_n": 10, "draft_n_accepted": 5},
        {**probe, "config": "drafter", "kind": "image", "rep": 1, "ttft_ms": 30.0, "tokens_per_second": 5000.0,
         "draft_n": 10, "draft_n_accepted": 7},
        {**probe, "config": "baseline", "kind": "image", "rep": 0, "ttft_ms": 18.0, "tokens_per_second": 7000.0},
        {"config": "baseline", "kind": "audio", "rep": 0, "ok": False, "reason": "the audio request answered 500"},
    ]
    summary = {(m["config"], m["kind"]): m for m in results.summarize_media(probes)}
    assert summary[("drafter", "image")] == {"config": "drafter", "kind": "image", "probes": 2, "failed": 0,
                                              "ttft_ms": 25.0, "tokens_per_second": 4500.0, "prompt_tokens": 111.0,
                                              "acceptance": 0.6}
    assert summary[("baseline", "image")]["acceptance"] is None
    assert summary[("baseline", "audio")]["failed"] == 1 and summary[("baseline", "audio")]["ttft_ms"] is None


def test_engines_report_says_when_engines_serve_different_models() -> None:
    from edgekit.bench import report

    row = {"engine": "llama.cpp", "concurrency": 1, "context_length": None, "tokens_per_second": 1.0,
           "baseline_tokens_per_second": 1.0, "speedup": 1.0, "acceptance": 0.5, "ttft_p50_s": 0.1,
           "baseline_ttft_p50_s": 0.1, "joules_per_token": None, "baseline_joules_per_token": None}
    same = {"target": "tiny-gemma4-e2b-tuned", "drafter": "tiny-gemma4-e2b-assistant (aligned)"}
    doc = {"summary": {"engines": [row]}, "engines": [{"engine": "llama.cpp", "sources": same},
                                                      {"engine": "litert-lm", "sources": dict(reversed(same.items()))}]}
    assert "different models" not in "\n".join(report._engines(doc))  # the same models, whatever the key order
    doc["engines"].append({"engine": "vllm", "recipe": "old"})  # a release from before `sources`
    text = "\n".join(report._engines(doc))
    assert "llama.cpp: `tiny-gemma4-e2b-tuned` + `tiny-gemma4-e2b-assistant (aligned)`" in text
    assert "vllm: recipe `old`" in text and "not the engine alone" in text


def test_plots_draw_an_interval_only_from_three_repetitions_and_never_below_zero() -> None:
    two = stats.estimate([3.0, 30.0]).to_json()  # t = 12.7 at one degree of freedom: ±171 around 16.5
    assert two["ci95"] > two["mean"]
    assert plots.error_bars([two]) == [[0.0], [0.0]]
    three = stats.estimate([1.0, 2.0, 30.0]).to_json()  # its interval reaches below zero: clipped there
    below, above = plots.error_bars([three])
    assert below == [pytest.approx(three["mean"])] and above == [pytest.approx(three["ci95"])]
    tight = stats.estimate([10.0, 10.5, 11.0]).to_json()
    assert plots.error_bars([tight]) == [[pytest.approx(tight["ci95"])], [pytest.approx(tight["ci95"])]]


def test_the_categories_the_drafter_loses_on_are_the_ones_to_send_with_drafting_off() -> None:
    def row(cat: str, c: int, mean: float, values: list[float]) -> dict:
        e = stats.estimate(values)
        return {"category": cat, "concurrency": c, "context_length": None, "speedup": e.to_json(),
                "verdict": results._verdict(e), "_mean": mean}

    rows = [row("all", 1, 1.1, [1.05, 1.1, 1.15]), row("code", 1, 1.5, [1.45, 1.5, 1.55]),
            row("json", 1, 0.8, [0.78, 0.8, 0.82]), row("json", 2, 0.7, [0.68, 0.7, 0.72]),
            row("prose", 1, 1.0, [0.8, 1.0, 1.2]), row("all", 2, 0.8, [0.7, 0.8, 0.9])]
    off = results.drafting_off(rows)
    assert off == [{"category": "json", "loses_at": [{"concurrency": 1, "context_length": None, "temperature": 0.0},
                                                      {"concurrency": 2, "context_length": None, "temperature": 0.0}]}]
    text = "\n".join(report._drafting_off({"request": {"speculative.n_max": 0}, "categories": off}))
    assert '`{"speculative.n_max": 0}`' in text and "- json (the drafter loses at c=1, c=2)" in text
    assert "No prompt category loses" in "\n".join(report._drafting_off({"request": {"x": 0}, "categories": []}))
    assert report._drafting_off(None) == []  # an engine that cannot turn drafting off per request: no advice


def test_the_speedup_is_drawn_against_context_length(tmp_path: Path) -> None:
    def up(m: float) -> dict:
        return stats.estimate([m * f for f in (0.97, 1.0, 1.03)]).to_json()

    doc = {"summary": {"speedups": [{"concurrency": c, "context_length": ctx, "speedup": up(m),
                                     "decode_speedup": up(m + 0.1)}
                                    for c in (1, 4) for ctx, m in ((128, 1.6), (2048, 1.3), (8192, 1.05))]}}
    plots.speedup_vs_context(doc, tmp_path / "ctx.png")
    one = {"summary": {"speedups": [doc["summary"]["speedups"][0]]}}
    plots.speedup_vs_context(one, tmp_path / "one.png")  # one context length: says how to get the curve
    for name in ("ctx.png", "one.png"):
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (tmp_path / "ctx.png").stat().st_size > (tmp_path / "one.png").stat().st_size


def test_context_lengths_the_memory_or_the_model_cannot_hold_are_left_out() -> None:
    from edgekit.bench import memory_points
    from edgekit.errors import EdgekitError

    recipe = load_recipe("e2b-mtp")
    plan = make_plan(recipe, Overrides(concurrency=[1, 2], context_lengths=[128, 8192, 32768, 262144]),
                     quick=False, categories=5)
    release = {"files": {"models/target.gguf": {"size": 3_000_000_000}, "bin/llama-server": {"size": 10**8}},
               "kv_bytes_per_token": 100_000, "model_context": 131072, "runtime": {"ctx_size": 4096}}
    said: list[str] = []
    # 2 slots: 8192 needs ≈ 1.7 GB of cache, 32768 ≈ 6.6 GB; the models 3 GB. 7 GB available + what the
    # stopped service frees (3 GB + 0.4 GB of its cache).
    fitted = memory_points.fit(plan, [release], release, 7000, said.append)
    assert sorted({p.context_length for p in fitted.points}) == [128, 8192]
    assert fitted.slot_ctx == 8192 + plan.n_gen + 256 and len(fitted.points) == 4
    assert said[0] == "context lengths [262144] left out: the model was trained for 131072 tokens"
    assert said[1].startswith("context length 32768 left out: 2 slot(s) of 33280 tokens need ≈ 10")
    assert "the board has 10410 MB (MemAvailable 7000 MB + 3410 MB the stopped service frees)" in said[1]
    # The service keeps running (--shared): nothing freed, less fits.
    assert {p.context_length for p in memory_points.fit(plan, [release], None, 5000, said.append).points} == {128}
    with pytest.raises(EdgekitError, match=r"^No context length of this bench fits the board's memory: context"):
        memory_points.fit(plan, [release], None, 1000, said.append)
    # A release from before the record: measured as asked, and said so; the deployed slots are not re-sized.
    old = {k: v for k, v in release.items() if k not in ("kv_bytes_per_token", "model_context")}
    kept = memory_points.fit(plan, [old], old, 1000, said.append)
    assert kept.points == plan.points and "not checked" in kept.notes[-1]
    deployed = make_plan(recipe, Overrides(slots="deployed", context_lengths=[128]), quick=False, categories=5)
    assert memory_points.fit(deployed, [release], None, 10, said.append).points == deployed.points
