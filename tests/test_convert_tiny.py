"""The generated tiny Gemma 4 pair: deterministic, the shapes llama.cpp's converter needs, a QAT copy
on a 4-bit grid, and a drafter transformers accepts for assisted generation."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from edgekit.convert.qat import eligible_shape, exact_q4_0
from edgekit.models.safetensors import open_model
from edgekit.tinymodels.grid import snap_to_grid
from edgekit.tinymodels.legacy import ensure_tiny_pair, make_tiny_pair
from edgekit.tinymodels.tokenizer import SPECIALS, write_tokenizer


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return ensure_tiny_pair(tmp_path_factory.getbasetemp() / "edgekit-tiny", seed=0, qat=False)


@pytest.fixture(scope="module")
def qat_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return ensure_tiny_pair(tmp_path_factory.getbasetemp() / "edgekit-tiny", seed=0, qat=True)


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_same_seed_same_bytes_other_seed_other_weights(pair: tuple[Path, Path], tmp_path: Path) -> None:
    again = make_tiny_pair(tmp_path / "again", seed=0)
    for a, b in zip(pair, again, strict=True):
        for name in ("model.safetensors", "tokenizer.json", "config.json"):
            assert _sha(a / name) == _sha(b / name), name
    other = make_tiny_pair(tmp_path / "other", seed=1)
    assert _sha(other[0] / "model.safetensors") != _sha(pair[0] / "model.safetensors")


def test_tokenizer_has_the_shape_llama_cpp_reads(tmp_path: Path) -> None:
    n = write_tokenizer(tmp_path)
    tok = json.loads((tmp_path / "tokenizer.json").read_text())
    model = tok["model"]
    assert model["type"] == "BPE" and model["byte_fallback"] is True and tok["decoder"]["type"] == "Sequence"
    vocab = model["vocab"]
    assert len(vocab) == n == 400
    assert [vocab[s] for s in SPECIALS] == list(range(6))
    assert all(f"<0x{b:02X}>" in vocab for b in range(256))
    assert [d["type"] for d in tok["decoder"]["decoders"]] == ["Replace", "ByteFallback", "Fuse"]
    assert write_tokenizer(tmp_path / "big", 4096) == 4096  # padded with <unusedN>, as for benchmarks


def test_configs_are_a_real_target_drafter_pair(pair: tuple[Path, Path]) -> None:
    target = json.loads((pair[0] / "config.json").read_text())
    drafter = json.loads((pair[1] / "config.json").read_text())
    assert target["architectures"] == ["Gemma4ForConditionalGeneration"]
    assert drafter["architectures"] == ["Gemma4AssistantForCausalLM"]
    assert drafter["backbone_hidden_size"] == target["text_config"]["hidden_size"] == 64
    assert set(target["text_config"]["layer_types"]) == {"sliding_attention", "full_attention"}
    assert target["text_config"]["hidden_size_per_layer_input"] == 16
    gen = json.loads((pair[1] / "generation_config.json").read_text())
    assert gen["num_assistant_tokens"] == 3


def test_qat_copy_is_on_the_grid_and_the_plain_one_is_not(pair: tuple[Path, Path],
                                                           qat_pair: tuple[Path, Path]) -> None:
    for plain_dir, qat_dir in zip(pair, qat_pair, strict=True):
        plain, qat = open_model(plain_dir), open_model(qat_dir)
        grid = [n for n, f in qat.items() if eligible_shape(f.tensors[n].shape)]
        assert grid
        for name in grid:
            assert exact_q4_0(qat[name].float32(name)).exact, name
            assert not exact_q4_0(plain[name].float32(name)).exact, name


def test_snap_to_grid_steps_fit_bf16_and_fp16() -> None:
    import torch

    w = torch.randn(8, 64) * 0.05
    snapped = snap_to_grid(w, seed=3)
    assert snapped.dtype == torch.bfloat16
    values = snapped.float().numpy()
    assert exact_q4_0(values).exact
    assert np.array_equal(values, snap_to_grid(w, seed=3).float().numpy())


def test_transformers_assisted_generation_matches_plain_greedy(pair: tuple[Path, Path]) -> None:
    import torch
    from transformers import AutoTokenizer, Gemma4AssistantForCausalLM, Gemma4ForConditionalGeneration

    from edgekit.models.hfcompat import patch_transformers

    patch_transformers()
    target = Gemma4ForConditionalGeneration.from_pretrained(pair[0], dtype=torch.float32)
    drafter = Gemma4AssistantForCausalLM.from_pretrained(pair[1], dtype=torch.float32)
    ids = AutoTokenizer.from_pretrained(pair[0])("The quick brown fox", return_tensors="pt")
    plain = target.generate(**ids, max_new_tokens=16, do_sample=False)
    assisted = target.generate(**ids, max_new_tokens=16, do_sample=False, assistant_model=drafter)
    assert plain.tolist() == assisted.tolist()
