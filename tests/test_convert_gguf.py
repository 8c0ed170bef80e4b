"""`edgekit convert` end to end: real conversions of the tiny pair into a store, loaded and served by
the host llama-server with and without the MTP drafter (same greedy text, drafts made)."""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path

import pytest
from build_helpers import sdist_or_skip
from click.testing import CliRunner
from llama_helpers import host_llama_bin, served

from edgekit.cli import cli
from edgekit.config.recipes import Recipe, load_recipe
from edgekit.convert.gguf_io import GGUFFile
from edgekit.prepare.pipeline import ConvertResult, convert_recipe
from edgekit.store import Store

PROMPT = "The quick brown fox jumps over the lazy dog. Once upon a time"


@pytest.fixture(scope="module")
def llama_bin() -> Path:
    return host_llama_bin()


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Store:
    # One store for the session's convert tests: a conversion another module already made is reused.
    return Store(tmp_path_factory.getbasetemp() / "edgekit-store")


def _recipe(name: str, target: dict, drafter: dict) -> Recipe:
    return Recipe.model_validate({"name": name, "target": target, "drafter": drafter,
                                  "runtime": {"spec_type": "draft-mtp"}})


def _by_role(result: ConvertResult) -> dict[str, Path]:
    return {m.role: m.file for m in result.models}


@pytest.fixture(scope="module")
def f32_pair(deploy_store: Store) -> ConvertResult:
    # The recipe the sim deploys serve, in their store: its E2B pair is aligned once per run, not once per store.
    return convert_recipe(load_recipe("sim-tiny-mtp"), deploy_store, src=str(sdist_or_skip()))


@pytest.fixture(scope="module")
def exact_pair(store: Store) -> ConvertResult:
    recipe = _recipe("qat", {"synthetic": "tiny-gemma4-qat", "quant": "q4_0-exact"},
                     {"synthetic": "tiny-gemma4-assistant-qat", "quant": "q4_0-exact", "fallback": "F16"})
    return convert_recipe(recipe, store, src=str(sdist_or_skip()))


def test_sim_recipe_converts_checks_and_stores(f32_pair: ConvertResult, deploy_store: Store) -> None:
    models = {m.role: m.to_dict() for m in f32_pair.models}
    assert models["target"]["arch"] == "gemma4" and models["drafter"]["arch"] == "gemma4-assistant"
    # The published E2B structure: text GGUF without the towers (convert.mmproj: off in this recipe).
    # The drafter keeps its ordered head's centroids and token ordering (edgekit's llama.cpp patch 0002).
    assert models["target"]["tensors"] == 176 and models["drafter"]["tensors"] == 51
    assert [m.role for m in f32_pair.models] == ["target", "drafter"]
    manifest = f32_pair.models[0].artifact.manifest
    assert manifest["converter"]["commit"].startswith("0c1e570")
    assert manifest["source"]["synthetic"] == "tiny-gemma4-e2b-tuned" and manifest["quant"] == "F32"
    assert {f["name"] for f in manifest["files"]} == {"target-f32.gguf", "target-convert.log"}
    # The recipe's align block: the drafter converted is the one re-fitted to this target.
    assert "aligned" in f32_pair.models[1].artifact.manifest["source"]
    assert all(len(f["sha256"]) == 64 for f in manifest["files"])

    start = time.monotonic()
    again = convert_recipe(load_recipe("sim-tiny-mtp"), deploy_store, src=str(sdist_or_skip()))
    assert all(m.cached for m in again.models) and time.monotonic() - start < 5
    assert [m.artifact.key for m in again.models] == [m.artifact.key for m in f32_pair.models]


def test_cli_convert_json_reports_the_cached_artifacts(f32_pair: ConvertResult, deploy_store: Store) -> None:
    res = CliRunner().invoke(cli, ["convert", "--recipe", "sim-tiny-mtp", "--src", str(sdist_or_skip()), "--json"],
                             env={"EDGEKIT_STORE": str(deploy_store.root)})
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert [(m["role"], m["cached"]) for m in data["models"]] == [("target", True), ("drafter", True)]
    assert [m["key"] for m in data["models"]] == [m.artifact.key for m in f32_pair.models]
    assert data["models"][1]["arch"] == "gemma4-assistant" and len(data["models"][1]["sha256"]) == 64


def test_q4_0_exact_recipe_repacks_every_weight(exact_pair: ConvertResult) -> None:
    for m in exact_pair.models:
        rp = m.artifact.manifest["repack"]
        assert rp["tensors_exact"] == rp["tensors_quantizable"] > 0 and rp["exact_block_fraction"] == 1.0
        assert rp["proof_bit_exact"] and rp["size_vs_q8_0"] < 0.7
        assert m.artifact.file(f"{m.role}-repack.json").is_file()
    assert exact_pair.models[1].artifact.manifest["fallback"] == "F16"


def test_llama_quantize_types(store: Store, llama_bin: Path) -> None:
    recipe = _recipe("kq", {"synthetic": "tiny-gemma4", "quant": "Q4_K_M"},
                     {"synthetic": "tiny-gemma4-assistant", "quant": "Q8_0"})
    result = convert_recipe(recipe, store, src=str(sdist_or_skip()), bin_dir=str(llama_bin))
    target = result.models[0].artifact.manifest["gguf"]
    assert target["arch"] == "gemma4" and target["file_type"] == 15  # MOSTLY_Q4_K_M
    assert result.models[1].artifact.manifest["gguf"]["types"].get("Q8_0", 0) > 0


# --- served by the host llama-server ------------------------------------------------------------


@pytest.fixture(scope="module")
def e2b_exact_pair(store: Store) -> ConvertResult:
    """The published E2B structure (towers, double-wide MLP, ordered-embedding assistant), QAT, exact Q4_0."""
    recipe = _recipe("e2b-qat", {"synthetic": "tiny-gemma4-e2b-qat", "quant": "q4_0-exact"},
                     {"synthetic": "tiny-gemma4-e2b-assistant-qat", "quant": "q4_0-exact", "fallback": "F16"})
    return convert_recipe(recipe, store, src=str(sdist_or_skip()))


def test_published_structure_repacks_exactly_and_keeps_the_ordered_head(
        e2b_exact_pair: ConvertResult) -> None:
    by_role = {m.role: m for m in e2b_exact_pair.models}
    target, drafter, mmproj = by_role["target"], by_role["drafter"], by_role["mmproj"]
    # The towers go to their own GGUF (llama.cpp's --mmproj), with Gemma 4's vision and audio projectors.
    assert mmproj.artifact.manifest["gguf"]["projectors"] == ["gemma4v", "gemma4a"]
    for m in (target, drafter):
        rp = m.artifact.manifest["repack"]
        assert rp["tensors_exact"] == rp["tensors_quantizable"] > 0 and rp["proof_bit_exact"], m.role
    # The text GGUF has no tower tensors (the converter drops them); it does keep the KV-shared layers'
    # k/v projections, which nothing reads (on the grid here, so they repack exactly too).
    assert target.artifact.manifest["gguf"]["arch"] == "gemma4" and "head" not in target.artifact.manifest
    head = drafter.artifact.manifest["head"]
    assert head["checkpoint"] == "ordered" and head["gguf"] == "ordered" and head["dropped"] == []
    assert (head["tokens_scored"], head["gguf_tokens_scored"]) == (128, 128)
    assert head["note"] is None and drafter.to_dict()["head"] == head
    gguf = GGUFFile(drafter.file)  # the head's tensors and sizes, as llama.cpp's loader reads them
    tensors = {t.name: t for t in gguf.tensors}
    assert tensors["masked_embd_ordering"].type.name == "F32"  # token ids below 2^24 are exact in f32
    keys = ("gemma4-assistant.masked_embd.centroid_count", "gemma4-assistant.masked_embd.centroid_top_k")
    assert tuple(gguf.get(k) for k in keys) == (head["num_centroids"], head["top_k"])
    assert "masked_embd_centroids.weight" in tensors


def _complete(url: str, **extra: object) -> dict:
    body = json.dumps({"prompt": PROMPT, "n_predict": 48, "temperature": 0.0, "top_k": 1, "seed": 1,
                       "ignore_eos": True, "cache_prompt": False, **extra}).encode()
    req = urllib.request.Request(f"{url}/completion", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read())


@pytest.mark.parametrize("pair", ["f32_pair", "exact_pair", "e2b_exact_pair"])
def test_mtp_drafter_keeps_greedy_text_and_drafts(pair: str, request: pytest.FixtureRequest, llama_bin: Path,
                                                  tmp_path: Path) -> None:
    files = _by_role(request.getfixturevalue(pair))
    with served(llama_bin, files["target"], None, tmp_path / "plain.log") as url:
        plain = _complete(url)
    with served(llama_bin, files["target"], files["drafter"], tmp_path / "mtp.log") as url:
        spec = _complete(url)
        # edgekit's patch 0001: a request turns drafting off (0), or shortens it, for itself alone
        off = _complete(url, **{"speculative.n_max": 0})
        one = _complete(url, **{"speculative.n_max": 1})
        again = _complete(url)
    assert plain["tokens_predicted"] == spec["tokens_predicted"] == 48
    assert spec["content"] == plain["content"] and plain["content"]
    assert spec["timings"]["draft_n"] > 0
    assert spec["timings"]["draft_n_accepted"] <= spec["timings"]["draft_n"]
    assert "draft" not in plain["timings"] or not plain["timings"].get("draft_n")
    assert off["content"] == one["content"] == plain["content"]
    assert not off["timings"].get("draft_n"), off["timings"]
    # one token per step at most (48 steps at most), and fewer than the server's three-token drafts make
    assert 0 < one["timings"]["draft_n"] <= 48, one["timings"]
    assert one["timings"]["draft_n"] < spec["timings"]["draft_n"], (one["timings"], spec["timings"])
    assert again["timings"]["draft_n"] == spec["timings"]["draft_n"]  # the next request drafts as the server says
