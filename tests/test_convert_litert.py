"""LiteRT-LM export of the tiny target: a `.litertlm` with TFLite models that LiteRT-LM runs on CPU and that
scores text exactly like transformers. Needs litert-torch 0.10.0 + tensorflow-cpu 2.21.0 + litert-lm-api
0.18.1 (the venv of `.ci/install`, or $EDGEKIT_LITERT_PYTHON); skipped without them."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml
from click.testing import CliRunner
from rich.console import Console

from edgekit.cli import cli
from edgekit.config.recipes import Recipe, load_recipe
from edgekit.convert import litert, litert_run
from edgekit.engines.llamacpp.models import resolve_models
from edgekit.prepare.pipeline import convert_recipe, prepare_inputs
from edgekit.store import Store
from edgekit.tinymodels.legacy import ensure_tiny_pair

pytestmark = pytest.mark.skipif(not litert.available(), reason="litert-torch / litert-lm-api not installed")

PROMPT, CONTINUATION = "The quick brown fox", " jumps over the lazy dog"


def hf_token_logprobs(model_dir: Path, prompt: str, continuation: str) -> list[float]:
    import torch
    from transformers import AutoTokenizer, Gemma4ForConditionalGeneration

    tok = AutoTokenizer.from_pretrained(model_dir)
    p = tok(prompt)["input_ids"]  # with <bos>, as LiteRT-LM's session starts
    c = tok(continuation, add_special_tokens=False)["input_ids"]
    model = Gemma4ForConditionalGeneration.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(torch.tensor([p + c])).logits[0].float()
    lp = torch.log_softmax(logits, dim=-1)
    return [float(lp[len(p) - 1 + i, t]) for i, t in enumerate(c)]


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> dict:
    recipe = Recipe.model_validate({
        "name": "lt", "target": {"synthetic": "tiny-gemma4", "quant": "F32"},
        "convert": {"gguf": False, "litert": True, "litert_quant": "none", "litert_prefill_lengths": [8],
                    "litert_cache_length": 64},
    })
    store = Store(tmp_path_factory.getbasetemp() / "edgekit-store")
    result = convert_recipe(recipe, store)
    assert convert_recipe(recipe, store).litert[0]["cached"] is True
    (entry,) = result.litert
    return entry


def test_export_holds_tflite_models_and_runs_in_litert_lm(exported: dict, tmp_path: Path) -> None:
    assert exported["sections"].count("TFLiteModel") >= 1 and "LlmMetadataProto" in exported["sections"]
    # The checkpoint's own tokenizer.json, not litert-torch's lossy SentencePiece fallback.
    assert "HF_Tokenizer_Zlib" in exported["sections"] and "SP_Tokenizer" not in exported["sections"]
    scores = litert_run.score_text(Path(exported["file"]), PROMPT, CONTINUATION, tmp_path)
    assert len(scores) == 16 and all(-12 < s < 0 for s in scores)  # a random 400-token model: ≈ ln(1/400)


@pytest.mark.parametrize("prompt", [PROMPT, "", "Once upon a time, in a land far away, there lived a small dog"])
def test_litert_scores_match_transformers(exported: dict, prompt: str,
                                          tmp_path_factory: pytest.TempPathFactory) -> None:
    scores = litert_run.score_text(Path(exported["file"]), prompt, CONTINUATION, tmp_path_factory.mktemp("lt"))
    target, _ = ensure_tiny_pair(tmp_path_factory.getbasetemp() / "edgekit-tiny")
    # Unquantized, LiteRT-LM computes transformers' float32 function: measured ≤ 3e-5 nats per token.
    np.testing.assert_allclose(scores, hf_token_logprobs(target, prompt, CONTINUATION), atol=1e-3)


def test_llamacpp_asks_for_the_ggufs_alone_and_convert_for_every_format(
        deploy_store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """sim-e2b-mtp lists ``convert.litert: true``. llama.cpp's models (what its release and a fleet rollout serve,
    converted for real into a fresh store) are the GGUFs and no LiteRT-LM bundle; ``edgekit convert`` of the same
    recipe still makes every format it lists."""
    doc = yaml.safe_load((Path(__file__).resolve().parents[1] / "edgekit/data/recipes/sim-e2b-mtp.yaml").read_text())
    assert doc["convert"]["litert"] is True
    doc["convert"]["mmproj"] = "off"  # the projector is not what this is about: two GGUFs convert faster than three
    path = tmp_path / "sim-e2b-mtp.yaml"
    path.write_text(yaml.safe_dump(doc))
    recipe = load_recipe(str(path))
    prepare_inputs(recipe, store=deploy_store)  # the aligned drafter: trained once per run, in the shared store
    fresh = tmp_path / "store"
    fresh.mkdir()
    (fresh / "drafter-aligned").symlink_to(deploy_store.root / "drafter-aligned")
    monkeypatch.setenv("EDGEKIT_STORE", str(fresh))  # also a memo key of its own: nothing recalled from elsewhere
    models = resolve_models(recipe, Console(quiet=True))
    assert sorted(models) == ["models/drafter.gguf", "models/target.gguf"]
    assert all(p.is_relative_to(fresh) for p in models.values())
    store = Store(fresh)
    assert len(store.list("gguf")) == 2 and store.list("litertlm") == []

    res = CliRunner().invoke(cli, ["--json", "convert", "--recipe", str(path)],
                             env={"EDGEKIT_STORE": str(deploy_store.root)})
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert [m["role"] for m in data["models"]] == ["target", "drafter"]
    (bundle,) = data["litert"]  # exported once per run (the LiteRT-LM deploys of the same pair share its key)
    assert bundle["role"] == "target+drafter" and deploy_store.get("litertlm", bundle["key"]) is not None
