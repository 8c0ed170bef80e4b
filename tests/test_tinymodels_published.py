"""Tiny models of the published E2B/E4B structure: what they are, the ordered head, and bad input."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from edgekit.convert.inputs import ensure_synthetic
from edgekit.errors import EdgekitError
from edgekit.models.safetensors import open_model
from edgekit.models.validate import check_pair, inspect_model
from edgekit.tinymodels import SYNTHETIC_MAKERS
from edgekit.tinymodels.published import published_config, tiny_layers


@pytest.fixture(scope="module", params=["e2b", "e4b"])
def pair(request: pytest.FixtureRequest) -> tuple[str, Path, Path]:
    v = request.param
    return v, ensure_synthetic(f"tiny-gemma4-{v}-qat"), ensure_synthetic(f"tiny-gemma4-{v}-assistant-qat")


def test_registry_has_every_variant() -> None:
    for v in ("e2b", "e4b"):
        for suffix in ("", "-qat", "-tuned", "-assistant", "-assistant-qat"):
            assert f"tiny-gemma4-{v}{suffix}" in SYNTHETIC_MAKERS


def test_target_has_the_published_structure(pair: tuple[str, Path, Path]) -> None:
    variant, target, _ = pair
    pub = published_config(f"gemma-4-{variant.upper()}-it")
    cfg = json.loads((target / "config.json").read_text())
    text = cfg["text_config"]
    assert cfg["architectures"] == ["Gemma4ForConditionalGeneration"] and cfg["eos_token_id"] == [1, 106]
    for key in ("use_double_wide_mlp", "rope_parameters", "final_logit_softcapping", "hidden_activation",
                "attention_k_eq_v", "num_key_value_heads"):
        assert text[key] == pub["text_config"][key], key
    # The full layers' head size spelled as published (not transformers 5.23's per-layer overrides).
    assert "per_layer_config" not in text and text["global_head_dim"] == 2 * text["head_dim"]
    assert cfg["vision_config"]["use_clipped_linears"] and cfg["audio_config"]["use_clipped_linears"]
    # Same sliding/full period as published; the KV-owning part ends on a full layer, as published.
    assert text["layer_types"] == tiny_layers(pub["text_config"]["layer_types"])
    period = pub["text_config"]["layer_types"].index("full_attention") + 1
    assert period == {"e2b": 5, "e4b": 6}[variant]
    first_shared = text["num_hidden_layers"] - text["num_kv_shared_layers"]
    assert text["layer_types"][first_shared - 1] == "full_attention"
    names = set(open_model(target))
    assert any(n.startswith("model.vision_tower.") for n in names)
    assert any(n.startswith("model.audio_tower.") for n in names)
    assert "lm_head.weight" not in names  # tied, as published
    # Published KV-shared layers still carry k/v projections transformers ignores.
    assert f"model.language_model.layers.{first_shared}.self_attn.k_proj.weight" in names
    # Double-wide MLP on the shared layers (E2B only).
    tensors = open_model(target)
    width = {i: tensors[n].tensors[n].shape[0] for i in (0, first_shared)
             for n in [f"model.language_model.layers.{i}.mlp.gate_proj.weight"]}
    assert width[first_shared] == width[0] * (2 if pub["text_config"]["use_double_wide_mlp"] else 1)
    # Gemma 4 token ids and a chat template that speaks its turn markers.
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(target)
    assert tok.convert_tokens_to_ids(["<|turn>", "<turn|>"]) == [105, 106]
    assert cfg["image_token_id"] == tok.convert_tokens_to_ids("<|image|>")
    chat = tok.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True)
    assert chat == "<bos><|turn>user\nHi<turn|>\n<|turn>model\n"
    assert inspect_model(target, "target").towers == ("vision", "audio")


def test_assistant_has_ordered_embeddings_and_fits_its_target(pair: tuple[str, Path, Path]) -> None:
    import torch
    from safetensors.torch import load_file

    _, target, drafter = pair
    cfg = json.loads((drafter / "config.json").read_text())
    assert cfg["architectures"] == ["Gemma4AssistantForCausalLM"] and cfg["use_ordered_embeddings"] is True
    assert cfg["text_config"]["num_kv_shared_layers"] == cfg["text_config"]["num_hidden_layers"] == 4
    weights = load_file(drafter / "model.safetensors")
    order = weights["masked_embedding.token_ordering"]
    assert order.dtype == torch.int64 and torch.equal(order.sort().values, torch.arange(order.numel()))
    assert not torch.equal(order, torch.arange(order.numel()))  # a real permutation, not the identity
    centroids = weights["masked_embedding.centroids.weight"]
    assert centroids.shape == (cfg["num_centroids"], cfg["text_config"]["hidden_size"])
    info = inspect_model(drafter, "drafter")
    assert info.ordered_head == {"num_centroids": 16, "top_k": 4} and info.head_tokens == 128
    check_pair(inspect_model(target, "target"), info)


def test_same_seed_same_bytes(tmp_path: Path) -> None:
    a = SYNTHETIC_MAKERS["tiny-gemma4-e2b-assistant"](tmp_path / "a", 0)
    b = SYNTHETIC_MAKERS["tiny-gemma4-e2b-assistant"](tmp_path / "b", 0)
    assert (a / "model.safetensors").read_bytes() == (b / "model.safetensors").read_bytes()


def test_exported_ordered_head_equals_transformers_and_the_dense_head_does_not() -> None:
    """The LiteRT MTP export's head (no scatter, convertible) against transformers' masked embedder."""
    import torch
    import transformers

    from edgekit.convert._litert_mtp import _ordered_head
    from edgekit.models.hfcompat import patch_transformers

    patch_transformers()
    path = ensure_synthetic("tiny-gemma4-e2b-assistant")
    drafter = transformers.Gemma4AssistantForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    head = _ordered_head(drafter)
    h = torch.randn(64, 1, 1, drafter.config.get_text_config().hidden_size, generator=torch.Generator().manual_seed(0))
    differs = 0
    with torch.no_grad():
        for x in h:
            ref = drafter.masked_embedding(x, drafter.lm_head.weight)
            got = head(x)
            assert torch.allclose(got, ref, atol=1e-6, rtol=0), float((got - ref).abs().max())
            assert int(got.argmax()) == int(ref.argmax())
            differs += int(drafter.lm_head(x).argmax()) != int(ref.argmax())
    # The full tied head (what llama.cpp keeps) is a different function: its argmax often leaves the top-k.
    assert differs > 0


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def test_centroids_that_do_not_divide_the_vocab_get_one_sentence(tmp_path: Path) -> None:
    bad = _copy(ensure_synthetic("tiny-gemma4-e2b-assistant"), tmp_path / "bad")
    cfg = json.loads((bad / "config.json").read_text())
    cfg["num_centroids"] = 15
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(EdgekitError, match=r"num_centroids 15, which does not divide its vocabulary of 512"):
        inspect_model(bad, "drafter")


def test_a_target_whose_towers_are_missing_gets_one_sentence(tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    bad = _copy(ensure_synthetic("tiny-gemma4-e2b"), tmp_path / "bad")
    weights = load_file(bad / "model.safetensors")
    save_file({k: v for k, v in weights.items() if not k.startswith("model.audio_tower.")},
              bad / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(EdgekitError, match=r"declares an audio tower .* no model.audio_tower.\* tensors"):
        inspect_model(bad, "target")


@pytest.mark.parametrize("head", ["ordered", "dense"])
def test_the_exported_drafter_graph_is_checked_against_transformers(head: str, monkeypatch) -> None:
    """The MTP drafter module the LiteRT export converts, in torch, against transformers' own drafter forward
    (what the export's self-check compares the converted graph with): with the ordered head it agrees; with
    the head dropped for the dense one it is off by more than the 1e-3 the self-check allows."""
    import torch
    import transformers

    from edgekit.convert import _litert_mtp
    from edgekit.models.hfcompat import patch_transformers

    patch_transformers()
    if head == "dense":
        monkeypatch.setattr(_litert_mtp, "_ordered_head", lambda drafter: drafter.lm_head)
    target = transformers.AutoConfig.from_pretrained(ensure_synthetic("tiny-gemma4-e2b")).get_text_config()
    drafter = transformers.Gemma4AssistantForCausalLM.from_pretrained(
        ensure_synthetic("tiny-gemma4-e2b-assistant"), dtype=torch.float32, attn_implementation="eager").eval()
    text = json.loads((ensure_synthetic("tiny-gemma4-e2b") / "config.json").read_text())["text_config"]
    cache, kv_heads = 32, text["num_key_value_heads"]
    kv = {}
    for i, kind in enumerate(text["layer_types"][: text["num_hidden_layers"] - text["num_kv_shared_layers"]]):
        dim = text["global_head_dim"] if kind == "full_attention" else text["head_dim"]
        kv[f"kv_cache_k_{i}"] = ([1, kv_heads, cache, dim], "float32")
        kv[f"kv_cache_v_{i}"] = ([1, kv_heads, dim, cache], "float32")  # litert-torch's transposed V
    module, sample, donors = _litert_mtp._drafter_step(drafter, target, kv)
    gen = torch.Generator().manual_seed(0)
    feeds = {n: torch.randn(t.shape, generator=gen) for n, t in sample["kv_cache"].items()}
    act = torch.randn(sample["activations"].shape, generator=gen)
    t = 10  # inside the sliding window: transformers' window convention and llama.cpp's agree there
    with torch.no_grad():
        got = module(act, torch.tensor([t], dtype=torch.int32), feeds)["logits"]
        shared = {kind: (feeds[f"k_{i}"][:, :, :t + 1], feeds[f"v_{i}"].transpose(2, 3)[:, :, :t + 1])
                  for kind, i in donors.items()}
        ref = drafter(inputs_embeds=act, position_ids=torch.tensor([[t + 1]]), shared_kv_states=shared).logits
    diff = float((got - ref).abs().max())
    assert (diff < 1e-4) if head == "ordered" else (diff > 1e-3), diff
