"""A fourth engine is one module and one line. ``plain`` (tests/engine_for_tests.py: built on
EngineBase from scratch, llama-server from the host build serving the tiny recipe's target alone, with argv and a
release layout of its own), registered with ``EDGEKIT_ENGINES`` and nothing in edgekit edited, goes through
deploy, status, a second deploy and rollback, `bench --engines` (alone, then side by side with llama.cpp) and a
fleet rollout on a simulated board. A real model on a real server throughout."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import yaml
from cli_helpers import edgekit, ok_json

from edgekit.bench import results

TESTS = Path(__file__).resolve().parent
REGISTER = "plain=engine_for_tests:Plain"  # the one line
RECIPE = "plain-tiny"

pytestmark = pytest.mark.skipif(not Path(sys.executable).with_name("ansible-playbook").is_file(),
                                reason="ansible-core is not installed (pip install 'ansible-core==2.19.*')")


def recipe(tmp: Path, **runtime: object) -> str:
    """The tiny published-structure E2B target of sim-tiny-mtp (converted once, then from the store), served
    by ``plain``; the bench's smallest plan (one point, one repetition, 16 tokens)."""
    data = {
        "name": RECIPE,
        "description": "The tiny E2B target alone, served by a test's own engine.",
        "target": {"synthetic": "tiny-gemma4-e2b-tuned", "quant": "F32"},
        "convert": {"mmproj": "off"},
        "runtime": {"engine": "plain", "ctx_size": 512, "n_gpu_layers": 0, "parallel": 1, "threads": 1,
                    "port": 8080, **runtime},
        "bench": {"n_gen": 16, "concurrency": [1], "context_lengths": [32], "repetitions": 1, "warmup": 0,
                  "cooldown_temp_c": None},
    }
    path = tmp / f"plain-{'-'.join(f'{k}{v}' for k, v in sorted(runtime.items())) or 'default'}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return str(path)


@pytest.fixture
def env(sim_session) -> dict[str, str]:
    path = os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")]))
    return {**os.environ, **sim_session.env, "EDGEKIT_ENGINES": REGISTER, "PYTHONPATH": path}


def test_an_engine_of_ones_own_deploys_rolls_back_benches_and_rolls_out(sim_session, env, tmp_path: Path,
                                                                         monkeypatch) -> None:
    from edgekit.deploy.health import check
    from edgekit.release.manifest import ReleaseManifest
    from edgekit.release.units import render_unit
    from edgekit.remote.runner import LocalRunner

    monkeypatch.setenv("EDGEKIT_ENGINES", REGISTER)  # this process asks the table too

    (board,) = sim_session.boards(1, fresh=True)

    # deploy: its own release (llama-server, its libraries, the target alone), checked through its health dialect.
    rep = ok_json(edgekit("--json", "deploy", "--board", board.name, "--recipe", recipe(tmp_path), env=env))
    assert rep["changed"] and rep["health"]["ok"] and rep["health"]["tokens"] > 0, rep["health"]
    assert rep["health"]["draft_n"] is None and rep["health"]["method"] == "chat completion", rep["health"]
    first = rep["release"]
    rdir = board.base / "releases" / first
    manifest = json.loads((rdir / "release.json").read_text())
    assert manifest["engine"] == "plain" and not manifest["drafter"] and manifest["chat"]
    assert manifest["server_args"][:2] == ["--model", "models/model.gguf"] and "--no-webui" in manifest["server_args"]
    assert not any(a.startswith("--spec") for a in manifest["server_args"])
    assert (rdir / "bin" / "llama-server").is_file() and (rdir / "lib" / "libllama-server-impl.so").is_file()
    assert (rdir / "models" / "model.gguf").stat().st_size > 0 and not (rdir / "models" / "drafter.gguf").exists()
    assert not (rdir / "lib" / "libllama-bench-impl.so").exists()
    unit = render_unit(json.loads((rdir / "units.json").read_text())["edgekit-serve.service"]).splitlines()
    exec_start = next(x for x in unit if x.startswith("ExecStart="))
    assert f" exec --log {board.base}/logs/server.log -- {rdir}/bin/llama-server --model models/model.gguf" \
        in exec_start, exec_start
    # The board-side check in the dialect the engine's class declares, through its chat template (a sim board's
    # ports are this machine's).
    own = check(LocalRunner(board.name), str(board.base), ReleaseManifest.of(manifest).serve, timeout=60, n_predict=8)
    assert own.ok and own.tokens > 0 and own.text and own.method == "chat completion", own

    st = ok_json(edgekit("--json", "status", "--board", board.name, env=env))
    assert st["engine"] == "plain" and st["current"] == st["serving"] == first and st["service_active"]
    assert st["health"]["ok"] and st["health"]["tokens"] > 0, st["health"]

    # A changed setting is a new release; rollback brings the first one back, healthy.
    rep = ok_json(edgekit("--json", "deploy", "--board", board.name, "--recipe", recipe(tmp_path, ctx_size=768),
                          env=env))
    second = rep["release"]
    assert rep["changed"] and second != first and rep["previous"] == first and rep["health"]["ok"], rep
    assert "768" in json.loads((board.base / "current" / "release.json").read_text())["server_args"]
    back = ok_json(edgekit("--json", "rollback", "--board", board.name, env=env))
    assert back["release"] == first and back["previous"] == second, back
    assert back["health"]["ok"] and back["health"]["tokens"] > 0, back["health"]
    assert os.readlink(board.base / "current") == f"releases/{first}"

    # bench --engines plain: its release, its bench configuration (the baseline alone: it has no drafter).
    doc = ok_json(edgekit("--json", "bench", "--board", board.name, "--recipe", recipe(tmp_path), "--quick",
                          "--engines", "plain", "--no-plots", "--out", str(tmp_path / "bench-plain"), env=env))
    results.validate(doc)
    assert doc["backend"] == "plain" and [(e["engine"], e["release"]) for e in doc["engines"]] == [("plain", first)]
    assert [r["config"] for r in doc["runs"]] == ["baseline"]
    assert all(r["errors"] == 0 and r["tokens"] > 0 and r["tokens_per_second"] > 0 for r in doc["runs"]), doc["runs"]
    assert doc["configurations"][0]["server_command"] == [f"{board.base}/releases/{first}/bin/llama-server"]

    # Side by side with llama.cpp's release of the same target (and its drafter) in one run.
    llama = ok_json(edgekit("--json", "deploy", "--board", board.name, "--recipe", "sim-tiny-mtp", env=env))["release"]
    rep = ok_json(edgekit("--json", "deploy", "--board", board.name, "--recipe", recipe(tmp_path), env=env))
    assert rep["release"] == first and rep["health"]["ok"], rep
    out = tmp_path / "bench-side-by-side"
    doc = ok_json(edgekit("--json", "bench", "--board", board.name, "--recipe", recipe(tmp_path), "--quick",
                          "--engines", "llama.cpp,plain", "--no-llama-bench", "--out", str(out), env=env))
    results.validate(doc)
    assert doc["backend"] == "engines"
    assert [(e["engine"], e["release"]) for e in doc["engines"]] == [("llama.cpp", llama), ("plain", first)]
    assert [r["config"] for r in doc["runs"]] == ["llama.cpp/drafter", "llama.cpp/baseline", "plain/baseline"]
    assert all(r["errors"] == 0 and r["tokens"] > 0 and r["tokens_per_second"] > 0 for r in doc["runs"]), doc["runs"]
    rows = {row["engine"]: row for row in doc["summary"]["engines"]}
    assert rows["plain"]["baseline_tokens_per_second"] > 0 and rows["plain"]["tokens_per_second"] is None
    assert rows["llama.cpp"]["acceptance"] > 0  # its drafter drafted and was measured beside plain
    assert "| plain | 1 | 32 |" in (out / "report.md").read_text()
    st = ok_json(edgekit("--json", "status", "--board", board.name, env=env))  # the bench put the service back
    assert st["current"] == first and st["service_active"] and st["health"]["ok"], st

    # fleet rollout of a changed setting: planned by the engine, pushed and activated by the playbook.
    res = edgekit("--json", "fleet", "rollout", "--recipe", recipe(tmp_path, ctx_size=640), "--group", board.name,
                  env=env)
    fleet = ok_json(res)
    assert list(fleet["succeeded"]) == [board.name] and not fleet["failed"] and fleet["changed"] == [board.name]
    row = fleet["succeeded"][board.name]
    assert row["release"] == fleet["planned"][board.name] not in (first, second, llama) and row["previous"] == first
    assert row["health"]["ok"] and row["health"]["tokens"] > 0 and row["push"]["sent_blobs"] > 0, row
    assert os.readlink(board.base / "current") == f"releases/{row['release']}"
    assert json.loads((board.base / "current" / "release.json").read_text())["engine"] == "plain"
