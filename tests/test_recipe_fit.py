"""A recipe's memory from its models' published structure, before a byte is downloaded (edgekit.models.footprint,
edgekit.engines.recipe_fit, `edgekit recipes fit`): the published figures of the larger Gemma 4 models, the cache
as llama.cpp allocates it (full layers the context, sliding layers a window per slot, K = V layers still with a V
cache, the assistant none), and the fit table that refuses the 31B on an 8 GB Orin and holds it on a 64 GB AGX Orin.
The counts are checked element for element against generated checkpoints, their GGUFs and llama-server's own KV
buffers in tests/test_larger_models.py."""

from __future__ import annotations

import pytest
from cli_helpers import edgekit, ok_json

from edgekit.engines import get_engine
from edgekit.engines.recipe_check import load_recipe
from edgekit.engines.recipe_fit import check_before_build, fit_row, recipe_size
from edgekit.errors import EdgekitError
from edgekit.models.footprint import footprint, swa_cells
from edgekit.models.gemma4_configs import config_name_of_repo, published_config


def _published(name: str):  # -> Footprint
    return footprint(published_config(name))


def test_the_published_models_have_their_published_sizes() -> None:
    # Google's model cards: 26B-A4B ≈ 25.2 B parameters of which ≈ 3.8 B active per token; 31B ≈ 30.7 B (its vision
    # tower is apart here); the assistants ≈ 0.42–0.47 B.
    moe, dense = _published("gemma-4-26B-A4B-it"), _published("gemma-4-31B-it")
    assert abs(sum(moe.parameters()) / 1e9 - 25.2) < 0.15 and abs(moe.active_matrix() / 1e9 - 3.8) < 0.1
    assert abs(sum(dense.parameters()) / 1e9 - 30.7) < 0.15 and dense.active_matrix() == dense.parameters()[0]
    for name in ("gemma-4-31B-it-assistant", "gemma-4-26B-A4B-it-assistant"):
        assert 0.40 < sum(_published(name).parameters()) / 1e9 < 0.48, name
    # Q4_0: 18 bytes per 32 weights; the 31B ≈ 17.3 GB, the MoE ≈ 14.2 GB with all its experts.
    assert 17.0e9 < dense.weight_bytes("q4_0-exact") < 17.6e9 and 14.0e9 < moe.weight_bytes("q4_0-exact") < 14.5e9
    # The 12B: ≈ 12 B parameters, bf16 ≈ 23.9 GB; Google's QAT Q4_0 GGUF ≈ 7.0 GB (it keeps some tensors wider).
    unified = _published("gemma-4-12B-it")
    assert abs(sum(unified.parameters()) / 1e9 - 11.9) < 0.2 and abs(unified.weight_bytes("BF16") / 1e9 - 23.9) < 0.3
    assert 6.5e9 < unified.weight_bytes("q4_0-exact") < 7.1e9


def test_the_cache_is_counted_as_llama_cpp_keeps_it() -> None:
    dense = _published("gemma-4-31B-it")
    kv = dense.kv()
    # 10 full layers × 4 KV heads × 512 (K and V both: llama.cpp keeps a V cache on K = V layers); 50 sliding
    # layers × 16 × 256, each slot holding 1024 + one 512-token batch, padded to 256 cells.
    assert (kv.full_k, kv.full_v, kv.swa_k, kv.window) == (10 * 4 * 512, 10 * 4 * 512, 50 * 16 * 256, 1024)
    assert swa_cells(32768, 1, 1024) == 1536 and swa_cells(32768, 4, 1024) == 4 * 1536
    assert swa_cells(1024, 1, 1024) == 1024  # never more than the context (a slot's share of it)
    f16 = kv.in_bytes(2.0, 2.0)
    assert f16.at(32768, 1) == 32768 * 81920 + 1536 * 819200  # ≈ 3.9 GB, not the 29.5 GB of every layer at full length
    assert f16.at(32768, 1) < f16.per_token_upper * 32768 / 4
    assert _published("gemma-4-31B-it-assistant").kv().in_bytes(2.0, 2.0).at(32768, 1) == 0  # reads the target's
    e2b = _published("gemma-4-E2B-it").kv()  # 35 layers, the last 20 read earlier ones' cache
    assert (e2b.full_k, e2b.swa_k) == (3 * 512, 12 * 256)


def test_repo_ids_name_the_structure_they_have() -> None:
    assert config_name_of_repo("google/gemma-4-31B-it-qat-q4_0-unquantized") == "gemma-4-31B-it"
    assert config_name_of_repo("google/gemma-4-26B-A4B-it-qat-q4_0-unquantized-assistant") == \
        "gemma-4-26B-A4B-it-assistant"
    assert config_name_of_repo("google/gemma-4-E2B-it") == "gemma-4-E2B-it"
    assert config_name_of_repo("google/gemma-4-12B-it-qat-q4_0-unquantized-assistant") == "gemma-4-12B-it-assistant"
    for unknown in ("google/gemma-4-99B-it", "someone/gemma-4-31B-it", "google/gemma-3-270m-it"):
        assert config_name_of_repo(unknown) is None, unknown


def test_the_31b_does_not_fit_an_8_gb_orin_and_fits_a_64_gb_one() -> None:
    recipe = load_recipe("31b-mtp")
    engine = get_engine(recipe.runtime.engine)
    from edgekit.config.profiles import get_profile

    nano, agx = get_profile("orin-nano-8gb"), get_profile("orin-agx-64gb")
    small = fit_row(recipe, engine, nano.mem_available_mb, nano.name)
    big = fit_row(recipe, engine, agx.mem_available_mb, agx.name)
    assert small["fits"] is False and small["longest_context"] is None
    # Not to its 262,144 tokens: drafting on Orin, flash attention is off, and every head's attention scores over the
    # whole cache are in each of its two contexts' compute buffers (17.7 GB apiece at 262,144).
    assert big["fits"] is True and big["longest_context"] == 131072 and big["need_at_longest_mb"] < agx.mem_available_mb
    assert [m["structure"] for m in big["models"]] == ["gemma-4-31B-it", "gemma-4-31B-it-assistant"]
    said: list[str] = []
    with pytest.raises(EdgekitError) as exc:
        check_before_build(recipe, engine, "nano", nano.name, nano.mem_available_mb, lambda: 0.0, said.append)
    sentence = str(exc.value)
    assert sentence.startswith(f"Board 'nano' has {nano.mem_available_mb} MB of memory available but recipe '31b-mtp'")
    assert "gemma-4-31B-it at q4_0-exact 17" in sentence and "nothing was downloaded, built or sent" in sentence
    assert "its weights alone do not fit" in sentence and "\n" not in sentence
    def not_read() -> float:  # what the serving release frees is read from the board only when it matters
        raise AssertionError("the serving release was read though the recipe fits")

    check_before_build(recipe, engine, "agx", agx.name, agx.mem_available_mb, not_read, said.append)
    assert said and said[-1].startswith("memory: ≈ 22") and "compute buffers 2181 MB" in said[-1], said[-1]
    # What the serving release frees as it stops counts: the same tight board holds it once that is added.
    check_before_build(recipe, engine, "agx", agx.name, 17_000, lambda: 6_000.0, said.append)
    assert said[-1].endswith("the board has 23000 MB")
    # A tighter board that holds it at a shorter context says which.
    with pytest.raises(EdgekitError, match=r"it would fit at runtime.ctx_size 4096\.$"):
        check_before_build(recipe.model_copy(update={"runtime": recipe.runtime.model_copy(
            update={"ctx_size": 65536})}), engine, "agx", agx.name, 22_500, lambda: 0.0, said.append)


def test_compute_buffers_grow_with_the_context_where_flash_attention_is_off() -> None:
    """Drafting on Orin, llama.cpp's flash attention is off (llama.cpp #24457): the scores of every head over the
    whole cache are in the compute buffers. On Thor it is on: a mask of the cache and the logits."""
    recipe = load_recipe("31b-mtp")
    engine = get_engine("llama.cpp")
    orin, thor = recipe_size(recipe, engine, "orin-agx-64gb"), recipe_size(recipe, engine, "thor-agx-128gb")
    assert orin is not None and thor is not None
    logits = 2 * 512 * 4 * 262144  # the target's and the assistant's contexts: 512 outputs of 262,144 tokens each
    assert thor.compute(262144) == logits + 2 * 512 * 2 * 262144  # an F16 mask of the cache in each
    assert orin.compute(262144) == logits + 2 * 512 * (4 * 32 + 4) * 262144  # 32 heads' F32 scores and an F32 mask
    assert orin.need(262144, 1).compute_mb > 36_000 and thor.need(262144, 1).compute_mb < 1_700
    # Without a board, the recipe as written (flash attention auto: llama.cpp turns it on).
    assert recipe_size(recipe, engine).compute(8192) == thor.compute(8192)


def test_a_quantized_cache_shrinks_the_need_and_the_moe_is_sized_with_every_expert() -> None:
    recipe = load_recipe("26b-a4b-mtp")
    engine = get_engine("llama.cpp")
    f16 = recipe_size(recipe, engine)
    q8 = recipe_size(recipe.model_copy(update={"runtime": recipe.runtime.model_copy(
        update={"llama_cpp": {"cache_type_k": "q8_0", "cache_type_v": "q8_0", "flash_attn": "on"}})}), engine)
    assert f16 is not None and q8 is not None
    assert q8.kv.full_per_token == int(f16.kv.full_per_token / 2 * 34 / 32)  # 34 bytes per 32 values, not 64
    assert f16.weights_mb > 14_000 and f16.active_bytes() < f16.weights_mb * 1e6 / 5  # 8 of 128 experts a token


def test_synthetic_and_local_models_are_sized_after_they_are_made() -> None:
    recipe = load_recipe("sim-tiny-mtp")
    assert recipe_size(recipe, get_engine("llama.cpp")) is None
    row = fit_row(recipe, get_engine("llama.cpp"), 1000)
    assert row["known"] is False and "deploy checks then" in row["why"]


def test_the_fit_table_of_every_profile() -> None:
    rows = ok_json(edgekit("--json", "recipes", "fit", "--recipe", "31b-mtp", "--recipe", "26b-a4b-mtp",
                           "--recipe", "12b-mtp", "--recipe", "e2b-mtp"))
    table = {(r["board"], r["recipe"]): r for r in rows}
    assert table[("orin-nx-16gb", "12b-mtp")]["fits"] and not table[("orin-nano-8gb", "12b-mtp")]["fits"]
    assert table[("orin-nano-8gb", "31b-mtp")]["fits"] is False
    assert table[("orin-nano-8gb", "e2b-mtp")]["fits"] is True
    assert table[("orin-agx-64gb", "31b-mtp")]["fits"] is True and table[("thor-agx-128gb", "26b-a4b-mtp")]["fits"]
    assert table[("orin-nx-16gb", "26b-a4b-mtp")]["fits"] is False  # 14.5 GB of weights: not with the OS beside it
    # The decode ceiling: bandwidth / bytes a token reads; the MoE reads far less than its size.
    assert table[("orin-agx-64gb", "26b-a4b-mtp")]["ceiling_tokens_per_second"] > \
        5 * table[("orin-agx-64gb", "31b-mtp")]["ceiling_tokens_per_second"]
    one = ok_json(edgekit("--json", "recipes", "fit", "--board", "orin", "--recipe", "31b-mtp"))
    assert [r["board"] for r in one] == ["orin-agx-64gb"]
    human = edgekit("recipes", "fit", "--board", "orin-nano-8gb", "--recipe", "31b-mtp")
    assert human.returncode == 0 and "31b-mtp" in human.stdout



def test_vllm_serves_the_checkpoints_in_bf16_and_is_sized_so() -> None:
    """vLLM's recipes name the bf16 checkpoints: the 31B (≈ 61 GB) is for a Thor, not a 64 GB Orin, whatever a
    recipe's `quant` says (vLLM does not convert)."""
    from edgekit.config.profiles import get_profile

    recipe = load_recipe("31b-mtp-vllm")
    engine = get_engine("vllm")
    size = recipe_size(recipe, engine)
    assert size is not None and [p.quant for p in size.parts] == ["BF16", "BF16"] and size.weights_mb > 61_000
    assert not fit_row(recipe, engine, get_profile("orin-agx-64gb").mem_available_mb)["fits"]
    assert fit_row(recipe, engine, get_profile("thor-agx-128gb").mem_available_mb)["fits"]
    moe = fit_row(load_recipe("26b-a4b-mtp-vllm"), engine, get_profile("orin-agx-64gb").mem_available_mb)
    assert moe["fits"] and moe["longest_context"] == 32768
