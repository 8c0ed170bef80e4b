"""`edgekit verify`: KL divergence and top-1 agreement of a converted target against its F32 model."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from build_helpers import sdist_or_skip

from edgekit.config.recipes import Recipe
from edgekit.convert.verify import parse_kld
from edgekit.errors import EdgekitError
from edgekit.prepare.pipeline import verify_recipe
from edgekit.store import Store

SAMPLE = """
====== Perplexity statistics ======
Mean PPL(Q)                   : 407.328125 ±   8.1
Mean PPL(base)                : 407.025052 ±   8.0
====== KL divergence statistics ======
Mean    KLD:   0.000105 ±   0.000005
Maximum KLD:   0.001201
====== Token probability statistics ======
Same top p: 88.121 ± 0.590 %
"""


def test_parse_kld_reads_llama_perplexity_summary() -> None:
    r = parse_kld(SAMPLE)
    assert r == {"ppl": 407.328125, "ppl_base": 407.025052, "mean_kld": 0.000105, "mean_kld_err": 0.000005,
                 "same_top1": pytest.approx(0.88121)}
    with pytest.raises(EdgekitError, match="no KL divergence"):
        parse_kld("main: too few tokens")


@pytest.fixture(scope="module")
def llama_bin() -> str:
    if os.environ.get("EDGEKIT_LLAMA_BIN"):
        return os.environ["EDGEKIT_LLAMA_BIN"]
    sdist_or_skip()
    from edgekit.build import host_build_for_tests

    return str(host_build_for_tests().bin_dir)


def test_verify_exact_q4_0_target(tmp_path_factory: pytest.TempPathFactory, llama_bin: str) -> None:
    recipe = Recipe.model_validate({
        "name": "v", "runtime": {"spec_type": "draft-mtp"},
        "target": {"synthetic": "tiny-gemma4-qat", "quant": "q4_0-exact"},
        "drafter": {"synthetic": "tiny-gemma4-assistant-qat", "quant": "q4_0-exact"},
    })
    store = Store(tmp_path_factory.getbasetemp() / "edgekit-store")  # shared with test_convert_gguf
    data = verify_recipe(recipe, store, src=str(sdist_or_skip()), bin_dir=llama_bin, ctx=64)
    t = data["target"]
    assert t["quant"] == "q4_0-exact" and t["chunks"] > 1
    # The weights are identical; only llama.cpp's Q8 activations in Q4_0 matmuls differ from F32.
    assert 0 <= t["mean_kld"] < 0.01 and t["same_top1"] > 0.5
    assert data["skipped"] == [{"role": "drafter", "why": "an MTP drafter runs only inside its target"}]
    hf = data["vs_transformers"]
    assert hf["faithful"] and set(hf["models"]) == {"F32", "q4_0-exact"}
    assert hf["models"]["F32"]["mean_kld"] < 1e-4


def test_verify_the_published_structure_against_transformers(tmp_path_factory: pytest.TempPathFactory,
                                                             llama_bin: str) -> None:
    """The tiny QAT E2B shape: its F32 GGUF computes what transformers computes; Q8_0 and exact Q4_0 measured
    against the checkpoint itself."""
    store = Store(tmp_path_factory.getbasetemp() / "edgekit-store")
    out = {}
    for quant in ("q4_0-exact", "Q8_0"):
        recipe = Recipe.model_validate({"name": "v-e2b", "runtime": {"spec_type": "none"},
                                        "target": {"synthetic": "tiny-gemma4-e2b-qat", "quant": quant}})
        data = verify_recipe(recipe, store, src=str(sdist_or_skip()), bin_dir=llama_bin, ctx=64)
        models = data["vs_transformers"]["models"]
        assert data["vs_transformers"]["faithful"] and models["F32"]["mean_kld"] < 1e-4
        assert data["vs_transformers"]["reference"].startswith("transformers ")
        out[quant] = models[quant]["mean_kld"]
    # Exact Q4_0 keeps the QAT weights bit for bit: only llama.cpp's 8-bit activations differ, less than Q8_0's
    # rounding of every weight.
    assert 0 < out["q4_0-exact"] < out["Q8_0"] < 0.01, out


@pytest.mark.parametrize("wrong", ["rope", "sliding_window"])
def test_a_gguf_that_computes_another_model_fails_against_transformers(wrong: str, tmp_path, llama_bin: str) -> None:
    """A GGUF converted from a config with a wrong RoPE (partial rotary 1 instead of 0.25) or sliding window is
    scored against the published checkpoint in transformers: the KL is beyond what edgekit calls faithful."""
    import json
    import shutil

    from edgekit.convert.hfreference import write_transformers_base
    from edgekit.convert.inputs import ensure_synthetic
    from edgekit.convert.llamacpp import find_llamacpp
    from edgekit.convert.verify import FAITHFUL, score, write_base

    src = ensure_synthetic("tiny-gemma4-e2b-tuned")
    llama = find_llamacpp(str(sdist_or_skip()), llama_bin, need_tools=True)
    results = {}
    for case in ("right", wrong):
        d = shutil.copytree(src, tmp_path / case)
        cfg = json.loads((d / "config.json").read_text())
        if case == "rope":
            cfg["text_config"]["rope_parameters"]["full_attention"]["partial_rotary_factor"] = 1.0
        elif case == "sliding_window":
            cfg["text_config"]["sliding_window"] //= 2
        (d / "config.json").write_text(json.dumps(cfg))
        gguf = tmp_path / f"{case}.gguf"
        llama.convert(d, gguf, "f32", tmp_path / f"{case}.log")
        work = tmp_path / f"w-{case}"
        base = write_base(Path(llama_bin), gguf, work, 64, 2)
        write_transformers_base(src, "Gemma4ForConditionalGeneration", base, work / "hf.kld")
        results[case] = score(Path(llama_bin), gguf, work / "hf.kld", work, "transformers", 64, 2).mean_kld
    assert results["right"] < FAITHFUL["max_mean_kld"] < results[wrong], results


def test_kld_falls_back_to_the_last_chunk_line_when_the_summary_is_lost() -> None:
    from edgekit.convert.verify import parse_kld

    # Real llama-perplexity output whose asynchronous logger exited before printing the summary.
    out = (
        "chunk             PPL               ln(PPL(Q)/PPL(base))          KL Divergence              Δp RMS"
        "            Same top p\n"
        "  62     406.1856 ±    1.4362       0.00048 ±    0.00031       0.00009 ±    0.00001     0.003 ±  0.000 %"
        "    89.646 ±  0.695 %\n"
        "  63     406.3982 ±    1.4259       0.00046 ±    0.00031       0.00009 ±    0.00000     0.003 ±  0.000 %"
        "    89.759 ±  0.686 %\n"
    )
    r = parse_kld(out)
    assert r["mean_kld"] == 0.00009 and abs(r["same_top1"] - 0.89759) < 1e-9 and r["ppl"] == 406.3982
