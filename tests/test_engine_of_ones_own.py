"""A fourth engine is one module and one line. ``plain`` (tests/engine_for_tests.py: built on
EngineBase from scratch, llama-server from the host build serving the tiny recipe's target alone, with argv and a
release layout of its own, its own recipe section, bench option, health dialect and counters, and key variable),
registered with ``EDGEKIT_ENGINES`` and nothing in edgekit edited (nor naming it), goes through deploy, status, a
second deploy and rollback, `bench --engines` (alone, then side by side with llama.cpp), a fleet rollout and a key
rotation on a simulated board. A real model on a real server throughout."""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
import urllib.request
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
        "runtime": {"engine": "plain", "ctx_size": 512, "parallel": 1, "port": 8080, "plain": {"threads": 1},
                    **runtime},
        "bench": {"n_gen": 16, "concurrency": [1], "context_lengths": [32], "repetitions": 1, "warmup": 0,
                  "cooldown_temp_c": None},
    }
    path = tmp / f"plain-{hashlib.sha256(repr(sorted(runtime.items())).encode()).hexdigest()[:12]}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return str(path)


@pytest.fixture
def env(sim_session) -> dict[str, str]:
    path = os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")]))
    return {**os.environ, **sim_session.env, "EDGEKIT_ENGINES": REGISTER, "PYTHONPATH": path}


def test_an_engine_of_ones_own_deploys_rolls_back_benches_and_rolls_out(sim_session, env, tmp_path: Path,
                                                                         monkeypatch) -> None:
    from engine_for_tests import Plain
    from gguf import LlamaFileType

    from edgekit.agent.health import read_counters
    from edgekit.convert.gguf_io import GGUFFile
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
    # its model is its own format, made by its own converter step: the target's GGUF requantized to Q8_0
    assert GGUFFile(rdir / "models" / "model.gguf").get("general.file_type") == LlamaFileType.MOSTLY_Q8_0
    made = ok_json(edgekit("--json", "convert", "--recipe", recipe(tmp_path), env=env))
    (own_format,) = made["formats"]["plain-q8"]
    served = (rdir / "models" / "model.gguf").read_bytes()
    assert own_format["cached"] and Path(own_format["file"]).read_bytes() == served
    target_f32 = next(m for m in made["models"] if m["role"] == "target")
    assert target_f32["quant"] == "F32" and own_format["size"] < target_f32["size"] / 3
    assert not (rdir / "lib" / "libllama-bench-impl.so").exists()
    unit = render_unit(json.loads((rdir / "units.json").read_text())["edgekit-serve.service"]).splitlines()
    exec_start = next(x for x in unit if x.startswith("ExecStart="))
    assert f" exec --log {board.base}/logs/server.log -- {rdir}/bin/llama-server --model models/model.gguf" \
        in exec_start, exec_start
    # The board-side check in the dialect the engine's class declares, through its chat template (a sim board's
    # ports are this machine's).
    own = check(LocalRunner(board.name), str(board.base), ReleaseManifest.of(manifest).serve, timeout=60, n_predict=8)
    assert own.ok and own.tokens > 0 and own.text and own.method == "chat completion", own
    # Its dialect is the OpenAI API's, its drafts the counters it names: llama-server keeps them in /metrics.
    assert manifest["draft_counters"] == list(Plain.draft_counters)
    with urllib.request.urlopen(f"http://127.0.0.1:{manifest['port']}/metrics", timeout=30) as resp:
        assert set(read_counters(resp.read().decode(), manifest["draft_counters"])) == {"draft", "accepted"}

    st = ok_json(edgekit("--json", "status", "--board", board.name, env=env))
    assert st["engine"] == "plain" and st["current"] == st["serving"] == first and st["service_active"]
    assert st["health"]["ok"] and st["health"]["tokens"] > 0, st["health"]

    # A changed setting is a new release; rollback brings the first one back, healthy.
    changed = recipe(tmp_path, ctx_size=768, plain={"threads": 1, "batch_size": 256})  # a shared and an own setting
    rep = ok_json(edgekit("--json", "deploy", "--board", board.name, "--recipe", changed, env=env))
    second = rep["release"]
    assert rep["changed"] and second != first and rep["previous"] == first and rep["health"]["ok"], rep
    args = json.loads((board.base / "current" / "release.json").read_text())["server_args"]
    assert args[args.index("--ctx-size") + 1] == "768" and args[args.index("--batch-size") + 1] == "256", args
    back = ok_json(edgekit("--json", "rollback", "--board", board.name, env=env))
    assert back["release"] == first and back["previous"] == second, back
    assert back["health"]["ok"] and back["health"]["tokens"] > 0, back["health"]
    assert os.readlink(board.base / "current") == f"releases/{first}"

    # bench --engines plain: its release, its bench configuration (the baseline alone: it has no drafter), with
    # its own option of the bench command.
    doc = ok_json(edgekit("--json", "bench", "--board", board.name, "--recipe", recipe(tmp_path), "--quick",
                          "--engines", "plain", "--plain-batch-size", "128", "--no-plots",
                          "--out", str(tmp_path / "bench-plain"), env=env))
    results.validate(doc)
    assert doc["backend"] == "plain" and [(e["engine"], e["release"]) for e in doc["engines"]] == [("plain", first)]
    assert [r["config"] for r in doc["runs"]] == ["baseline"]
    assert all(r["errors"] == 0 and r["tokens"] > 0 and r["tokens_per_second"] > 0 for r in doc["runs"]), doc["runs"]
    assert doc["configurations"][0]["server_command"] == [f"{board.base}/releases/{first}/bin/llama-server"]
    args = doc["configurations"][0]["server_args"]
    assert args[args.index("--batch-size") + 1] == "128", args

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


def test_its_own_recipe_section_is_validated_by_it_and_edgekit_never_names_it(tmp_path: Path, monkeypatch) -> None:
    """``runtime.plain:`` is this engine's: its model fills the defaults and refuses a bad value; a setting of
    its written among the shared ones is refused naming its place; and nothing of edgekit knows of it."""
    from edgekit.engines.recipe_check import load_recipe
    from edgekit.errors import EdgekitError

    monkeypatch.setenv("EDGEKIT_ENGINES", REGISTER)
    monkeypatch.syspath_prepend(str(TESTS))
    assert load_recipe(recipe(tmp_path)).runtime.section("plain") == {"threads": 1, "batch_size": 512}
    with pytest.raises(EdgekitError, match=r"line 1\d: field 'runtime\.plain\.batch_size': Input should be greater "
                                           r"than or equal to 32\.$"):
        load_recipe(recipe(tmp_path, plain={"batch_size": 8}))
    with pytest.raises(EdgekitError, match=r"line \d+: field 'runtime\.batch_size': a setting of engine plain, which "
                                           r"goes in its section: runtime\.plain\.batch_size\.$"):
        load_recipe(recipe(tmp_path, batch_size=256))
    with pytest.raises(EdgekitError, match=r"'runtime\.threads': a setting of engine plain.*runtime\.plain\.threads"):
        load_recipe(recipe(tmp_path, threads=2))  # llama.cpp has one too: the served engine's is named
    with pytest.raises(EdgekitError, match=r"field 'runtime\.spec_type': engine plain serves none, not 'ngram-simple'"):
        load_recipe(recipe(tmp_path, spec_type="ngram-simple"))  # llama.cpp's kind: not this engine's

    # Registered by the environment alone: no file of the installed package names it or its module.
    named = re.compile(r"engine_for_tests|PlainSettings|[\"']plain[\"']|runtime\.plain\b")
    package = TESTS.parent / "edgekit"
    hits = [str(p.relative_to(package)) for p in package.rglob("*") if p.is_file() and p.suffix in (
        ".py", ".yaml", ".yml", ".json", ".md", ".j2", ".sh", ".txt") and named.search(p.read_text(errors="replace"))]
    assert hits == [], hits


def test_its_key_reaches_its_server_through_the_variable_it_names(sim_session, env, tmp_path: Path) -> None:
    """``key_env = "LLAMA_API_KEY"``: with ``runtime.auth: key`` the board holds ``keys/LLAMA_API_KEY.env``, the
    unit's environment file, and no argument names the key or a key file; the health check, the server's refusal
    without the key and a rotation all go through it."""
    import urllib.error

    from edgekit.release.units import render_unit

    (board,) = sim_session.boards(1, fresh=True)
    rep = ok_json(edgekit("--json", "deploy", "--board", board.name, "--recipe", recipe(tmp_path, auth="key"),
                          env=env))
    assert rep["health"]["ok"] and rep["health"]["tokens"] > 0, rep["health"]
    manifest = json.loads((board.base / "current" / "release.json").read_text())
    env_file = board.base / "keys" / "LLAMA_API_KEY.env"
    assert manifest["api_env_file"] == str(env_file) and not any("api-key" in a for a in manifest["server_args"])
    key = (Path(env["EDGEKIT_CONFIG_DIR"]) / "keys" / f"{board.name}.key").read_text().strip()
    assert env_file.read_text() == f"LLAMA_API_KEY={key}\n" and oct(env_file.stat().st_mode & 0o777) == "0o600"
    unit = render_unit(json.loads((board.base / "current" / "units.json").read_text())["edgekit-serve.service"])
    assert f"--env-file {env_file}" in unit and key not in unit

    def props(with_key: str | None) -> int:
        headers = {"Authorization": f"Bearer {with_key}"} if with_key else {}
        req = urllib.request.Request(f"http://127.0.0.1:{manifest['port']}/props", headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                return resp.status
        except urllib.error.HTTPError as exc:
            return exc.code

    assert props(None) == 401 and props(key) == 200
    rotated = ok_json(edgekit("--json", "board", "key", "rotate", "--board", board.name, env=env))
    new = (Path(env["EDGEKIT_CONFIG_DIR"]) / "keys" / f"{board.name}.key").read_text().strip()
    assert rotated["release"] == rep["release"] and new != key and env_file.read_text() == f"LLAMA_API_KEY={new}\n"
    assert props(key) == 401 and props(new) == 200
