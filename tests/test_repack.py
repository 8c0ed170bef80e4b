"""Exact Q4_0 repack: the numpy search on its own, then real converter GGUFs of the tiny QAT pair."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
from build_helpers import sdist_or_skip
from click.testing import CliRunner
from gguf import GGMLQuantizationType, GGUFReader, quants

from edgekit.cli import cli
from edgekit.convert.llamacpp import LlamaCpp, _names_cached, find_llamacpp, pinned_tables
from edgekit.convert.qat import BLOCK, exact_q4_0, pack_q4_0, widen
from edgekit.errors import EdgekitError
from edgekit.models.safetensors import open_model
from edgekit.prepare.pipeline import repack_any
from edgekit.tinymodels.legacy import ensure_tiny_pair

Q4_0 = GGMLQuantizationType.Q4_0
Q8_0 = GGMLQuantizationType.Q8_0


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """float32 bit patterns equal, −0.0 taken as +0.0 (independent of edgekit's own comparison)."""
    a32, b32 = np.asarray(a, np.float32) + np.float32(0), np.asarray(b, np.float32) + np.float32(0)
    return a32.shape == b32.shape and np.array_equal(a32.view(np.uint32), b32.view(np.uint32))


def on_grid(rows: int, cols: int, seed: int = 0) -> np.ndarray:
    """QAT-like values: q·d with q ∈ [-8, 7] and d with 4 significant bits (exact in bf16)."""
    rng = np.random.default_rng(seed)
    n = rows * cols // BLOCK
    q = rng.integers(-8, 8, size=(n, BLOCK)).astype(np.float32)
    d = np.ldexp(1 + rng.integers(0, 8, size=(n, 1)) / 8, rng.integers(-14, -2, size=(n, 1))).astype(np.float32)
    return (q * d).reshape(rows, cols)


# --- the search itself --------------------------------------------------------------------------


def test_on_grid_tensor_is_exact_and_dequantizes_bit_for_bit() -> None:
    w = on_grid(64, 256)
    w[0, :BLOCK] = 0.0  # an all-zero block
    w[1, :BLOCK] = np.abs(w[1, :BLOCK])  # largest magnitude positive: needs a negative step
    res = exact_q4_0(w)
    assert res.exact and res.blocks == 64 * 256 // BLOCK and res.packed is not None
    assert res.packed.shape == (64, 256 // BLOCK * 18)
    assert same_bits(quants.dequantize(res.packed, Q4_0), w)


def test_bf16_bits_input_gives_the_same_blocks() -> None:
    w = on_grid(16, 64)
    bits = (w.view(np.uint32) >> 16).astype(np.uint16)  # on-grid values are exact in bf16
    assert np.array_equal(widen(bits), w)
    a, b = exact_q4_0(w), exact_q4_0(bits)
    assert a.exact and b.exact and np.array_equal(a.packed, b.packed)


def test_one_value_off_the_grid_makes_the_tensor_inexact_and_counts_blocks() -> None:
    w = on_grid(32, 128)
    w[3, 5] += np.float32(2.0**-20)
    res = exact_q4_0(w)
    assert not res.exact and res.packed is None
    assert res.blocks - res.exact_blocks == 1


def test_gaussian_weights_are_not_on_a_grid() -> None:
    rng = np.random.default_rng(1)
    w = (rng.normal(0, 0.02, size=(64, 128)).astype(np.float32).view(np.uint32) & 0xFFFF0000).view(np.float32)
    assert exact_q4_0(w).exact_blocks == 0


def test_nan_block_is_never_exact() -> None:
    w = on_grid(1, 64)
    w[0, 40] = np.nan
    res = exact_q4_0(w)
    assert res.exact_blocks == 1 and not res.exact


def test_pack_layout_is_ggml_block_q4_0() -> None:
    q = np.arange(-8, 24).clip(-8, 7).astype(np.int8)[None, :]
    packed = pack_q4_0(np.array([0.5], dtype=np.float16), q)
    assert packed.shape == (1, 18)
    assert packed[0, :2].view("<f2")[0] == np.float16(0.5)
    assert int(packed[0, 2]) == (int(q[0, 0]) + 8) | ((int(q[0, 16]) + 8) << 4)  # low: 0-15, high: 16-31
    assert np.array_equal(quants.dequantize(packed, Q4_0)[0], q[0].astype(np.float32) * 0.5)


def test_rows_that_do_not_split_into_blocks_are_refused() -> None:
    with pytest.raises(ValueError):
        exact_q4_0(np.zeros((4, 48), dtype=np.float32))


# --- real converter GGUFs of the tiny QAT pair -------------------------------------------------


@pytest.fixture(scope="module")
def llama() -> LlamaCpp:
    return find_llamacpp(str(sdist_or_skip()))


@pytest.fixture(scope="module")
def qat_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return ensure_tiny_pair(tmp_path_factory.getbasetemp() / "edgekit-tiny", seed=0, qat=True)


@pytest.fixture(scope="module")
def qat_q8(llama: LlamaCpp, qat_pair: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The converter's own Q8_0 files of the QAT pair: what the repack is measured against."""
    out = tmp_path_factory.mktemp("q8")
    files = {}
    for model in qat_pair:
        files[model.name] = out / f"{model.name}-q8_0.gguf"
        llama.convert(model, files[model.name], "q8_0", out / "convert.log")
    return files


def _source_values(model_dir: Path, llama: LlamaCpp) -> dict[str, np.ndarray]:
    """GGUF name → float32 values straight from the safetensors (mapped by the converter's rules)."""
    config = json.loads((model_dir / "config.json").read_text())
    files = open_model(model_dir)
    _arch, mapping = llama.gguf_names(config, sorted(files))
    return {g: files[h].float32(h) for h, g in mapping.items() if g}  # float32() widens bf16 exactly


def test_light_name_map_agrees_with_the_converter_classes(llama: LlamaCpp, qat_pair: tuple[Path, Path]) -> None:
    for model in qat_pair:
        config = json.loads((model / "config.json").read_text())
        names = sorted(open_model(model))
        names += ["model.vision_tower.encoder.layers.0.mlp.fc1.weight", "model.embed_audio.embedding_projection.weight",
                  "masked_embedding.centroids.weight"]  # what real E2B checkpoints also hold
        light = llama.gguf_names(config, names, light=True)  # the tree's tables, loaded in this process
        assert light == llama.gguf_names(config, names)
        # ... and the subprocess that answers when those tables cannot be loaded alone
        request = json.dumps({"config": config, "names": names, "light": True}, sort_keys=True)
        arch, mapping = _names_cached(str(llama.root), request)
        assert (arch, dict(mapping)) == light
    assert pinned_tables(str(llama.root)) is not None
    assert "gguf" not in sys.modules or not sys.modules["gguf"].__file__.startswith(str(llama.root))


def test_repack_of_qat_drafter_is_exact_and_proven(llama: LlamaCpp, qat_pair: tuple[Path, Path],
                                                   qat_q8: dict[str, Path], tmp_path: Path) -> None:
    _target, drafter = qat_pair
    out = tmp_path / "drafter-q4_0.gguf"
    report = repack_any(drafter, out, ref=qat_q8["drafter"], llama_src=str(sdist_or_skip()))
    s = report.summary()
    assert s["tensors_exact"] == s["tensors_quantizable"] > 0 and s["tensors_fallback"] == 0
    assert s["exact_block_fraction"] == 1.0 and s["bits_per_weight"] == 4.5
    assert s["proof_bit_exact"] and not s["q8_0_size_is_estimate"]
    assert s["size_vs_q8_0"] < 0.7  # tiny models carry a large share of F32 norms and metadata

    # Independent check: dequantize what landed in the file and compare with the safetensors.
    reader = GGUFReader(out)
    ref = GGUFReader(qat_q8["drafter"])
    assert reader.fields["general.architecture"].contents() == "gemma4-assistant"
    assert [t.name for t in reader.tensors] == [t.name for t in ref.tensors]
    for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "gemma4-assistant.embedding_length_out"):
        assert reader.fields[key].contents() == ref.fields[key].contents()
    assert reader.fields["general.file_type"].contents() == 2  # MOSTLY_Q4_0
    q4 = [t for t in reader.tensors if t.tensor_type == Q4_0]
    assert len(q4) == s["tensors_exact"]
    source = _source_values(drafter, llama)
    for t in q4:
        assert same_bits(quants.dequantize(np.asarray(t.data), Q4_0), source[t.name])


def test_repack_without_reference_takes_metadata_from_the_converter(qat_pair: tuple[Path, Path],
                                                                    tmp_path: Path) -> None:
    target, _drafter = qat_pair
    report = repack_any(target, tmp_path / "t.gguf", llama_src=str(sdist_or_skip()))
    s = report.summary()
    assert s["tensors_exact"] == s["tensors_quantizable"] and s["proof_bit_exact"]
    assert s["q8_0_size_is_estimate"] and 0 < s["size_vs_q8_0"] < 0.7
    assert "not converted" in report.template  # the fast path: no lossless detour
    types = {t.name: t.tensor_type for t in GGUFReader(tmp_path / "t.gguf").tensors}
    assert types["blk.0.ffn_down.weight"] == Q4_0 and types["blk.0.attn_norm.weight"] == GGMLQuantizationType.F32


def _bent(drafter: Path, into: Path) -> Path:
    """The drafter with one value of one weight pushed off the 4-bit grid."""
    import torch
    from safetensors.torch import load_file, save_file

    shutil.copytree(drafter, into)
    weights = load_file(into / "model.safetensors")
    name = "model.layers.0.mlp.down_proj.weight"
    w = weights[name].clone()
    w[0, 0] = w[0, 0] + torch.tensor(1e-3, dtype=torch.bfloat16)
    weights[name] = w
    save_file(weights, into / "model.safetensors", metadata={"format": "pt"})
    return into


@pytest.mark.parametrize("which", ["target", "drafter", "bent-drafter"])
def test_fast_repack_writes_the_bytes_of_the_lossless_template_path(llama: LlamaCpp, qat_pair: tuple[Path, Path],
                                                                    tmp_path: Path, which: str,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    # The same input gives the same file whether the template is the converter's whole bf16 GGUF (the
    # old path) or its skeleton with the weights packed straight from the safetensors (the new one).
    import hashlib

    from edgekit.convert.checkpoint_repack import repack_checkpoint
    from edgekit.convert.gguf_io import GGUFFile
    from edgekit.convert.gguf_stage import lossless_outtype
    from edgekit.convert.repack import GGUFValues, repack_gguf
    from edgekit.models.validate import inspect_model

    monkeypatch.setenv("EDGEKIT_CACHE", str(tmp_path / "cache"))  # no skeleton from an earlier test
    target, drafter = qat_pair
    model = {"target": target, "drafter": drafter}.get(which) or _bent(drafter, tmp_path / "bent")
    info = inspect_model(model, "target" if which == "target" else "drafter")
    outtype = lossless_outtype(info)
    work = tmp_path / "work"
    work.mkdir()
    fast = repack_checkpoint(llama, model, info.gguf_arch, outtype, tmp_path / "fast.gguf", "Q8_0", work,
                             work / "skeleton.log")
    assert fast is not None and {p.name for p in work.iterdir()} == {"skeleton.gguf", "skeleton.log"}
    llama.convert(model, tmp_path / "lossless.gguf", outtype, tmp_path / "convert.log")
    # The converter never wrote the weights: its skeleton holds the metadata and the small tensors only.
    assert (work / "skeleton.gguf").stat().st_size < (tmp_path / "lossless.gguf").stat().st_size / 3
    template = GGUFFile(tmp_path / "lossless.gguf")
    slow = repack_gguf(template, GGUFValues(template), tmp_path / "slow.gguf")

    def sha(p: Path) -> str:
        return hashlib.sha256(p.read_bytes()).hexdigest()

    assert sha(tmp_path / "fast.gguf") == sha(tmp_path / "slow.gguf")
    assert fast.summary() == slow.summary()
    assert fast.summary()["tensors_fallback"] == (1 if which == "bent-drafter" else 0)


def test_fast_repack_declines_architectures_whose_converter_transforms_weights(llama: LlamaCpp,
                                                                               qat_pair: tuple[Path, Path],
                                                                               tmp_path: Path) -> None:
    from edgekit.convert.checkpoint_repack import repack_checkpoint

    target, _ = qat_pair
    assert repack_checkpoint(llama, target, "llama", "bf16", tmp_path / "x.gguf", "Q8_0", tmp_path,
                             tmp_path / "log") is None
    assert not (tmp_path / "x.gguf").exists()


def test_off_grid_tensor_falls_back_whole(llama: LlamaCpp, qat_pair: tuple[Path, Path], qat_q8: dict[str, Path],
                                          tmp_path: Path) -> None:
    _target, drafter = qat_pair
    bent = _bent(drafter, tmp_path / "drafter-bent")  # one value leaves the grid

    for fallback, gtype in (("Q8_0", Q8_0), ("F16", GGMLQuantizationType.F16)):
        out = tmp_path / f"bent-{fallback}.gguf"
        report = repack_any(bent, out, ref=qat_q8["drafter"], fallback=fallback, llama_src=str(sdist_or_skip()))
        s = report.to_dict()
        assert s["tensors_fallback"] == 1 and s["tensors_exact"] == s["tensors_quantizable"] - 1
        (fb,) = s["fallback_tensors"]
        assert fb["name"] == "blk.0.ffn_down.weight" and fb["type"] == fallback and fb["missed_blocks"] == 1
        assert 0.99 < s["exact_block_fraction"] < 1.0 and s["proof_bit_exact"]
        t = next(t for t in GGUFReader(out).tensors if t.name == "blk.0.ffn_down.weight")
        assert t.tensor_type == gtype
        src = _source_values(bent, llama)["blk.0.ffn_down.weight"]
        if gtype == Q8_0:  # the same bytes the converter's Q8_0 has for it
            ref = next(t for t in GGUFReader(qat_q8["drafter"]).tensors if t.name == "blk.0.ffn_down.weight")
            assert np.array_equal(np.asarray(t.data), quants.quantize(src, Q8_0))
            assert not np.array_equal(np.asarray(t.data), np.asarray(ref.data))  # ref has the unbent values
        else:
            assert np.array_equal(np.asarray(t.data), src.astype(np.float16))


def test_cli_repack_json_and_errors(qat_pair: tuple[Path, Path], qat_q8: dict[str, Path], tmp_path: Path) -> None:
    _target, drafter = qat_pair
    out = tmp_path / "d.gguf"
    res = CliRunner().invoke(cli, ["repack", str(drafter), str(out), "--from-gguf", str(qat_q8["drafter"]),
                                   "--src", str(sdist_or_skip()), "--report", str(tmp_path / "r.json"), "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["exact_block_fraction"] == 1.0 and data["proof_bit_exact"] is True
    assert len(json.loads((tmp_path / "r.json").read_text())["tensors"]) == data["tensors_total"]

    # A target's Q8_0 as the reference of a drafter: refused before anything is written.
    with pytest.raises(EdgekitError, match="gemma4"):
        repack_any(drafter, tmp_path / "x.gguf", ref=qat_q8["target"], llama_src=str(sdist_or_skip()))
    assert not (tmp_path / "x.gguf").exists()
    with pytest.raises(EdgekitError, match="new file"):
        repack_any(qat_q8["drafter"], qat_q8["drafter"])


def test_cached_skeleton_is_reused_only_while_the_tensors_it_holds_are_unchanged(
        llama: LlamaCpp, qat_pair: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import hashlib

    from safetensors.torch import load_file, save_file

    from edgekit.convert.checkpoint_repack import repack_checkpoint

    monkeypatch.setenv("EDGEKIT_CACHE", str(tmp_path / "cache"))
    model = tmp_path / "drafter"
    shutil.copytree(qat_pair[1], model)

    def run(tag: str) -> tuple[str, bool]:
        work = tmp_path / tag
        work.mkdir()
        report = repack_checkpoint(llama, model, "gemma4-assistant", "bf16", work / "out.gguf", "Q8_0", work,
                                   work / "skeleton.log")
        assert report is not None
        converter_ran = (work / "skeleton.gguf").is_file()
        return hashlib.sha256((work / "out.gguf").read_bytes()).hexdigest(), converter_ran

    first, ran = run("a")
    assert ran
    again, ran = run("b")
    assert again == first and not ran  # the converter did not run again
    weights = load_file(model / "model.safetensors")
    norm = next(n for n in weights if n.endswith("norm.weight") and weights[n].ndim == 1)
    weights[norm] = weights[norm] * 2  # a tensor the skeleton holds, not one the repack packs
    save_file(weights, model / "model.safetensors", metadata={"format": "pt"})
    changed, ran = run("c")
    assert ran and changed != first
    slow = repack_any(model, tmp_path / "slow.gguf", llama_src=str(sdist_or_skip()), fast=False)
    assert slow.summary()["proof_bit_exact"]
    assert hashlib.sha256((tmp_path / "slow.gguf").read_bytes()).hexdigest() == changed


def test_token_list_is_kept_per_tokenizer_and_gives_the_same_bytes(
        llama: LlamaCpp, qat_pair: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The converter's token list is read once per tokenizer: a model never seen before (no skeleton of its
    # own) that ships the same tokenizer files takes it from the cache, and its file is byte for byte the same.
    import hashlib

    from edgekit.convert.checkpoint_repack import repack_checkpoint
    from edgekit.convert.skeleton import vocab_path

    monkeypatch.setenv("EDGEKIT_CACHE", str(tmp_path / "cache"))
    target, drafter = qat_pair
    assert vocab_path(llama, target) == vocab_path(llama, drafter)  # one tokenizer for the pair
    kept = vocab_path(llama, drafter)
    assert kept is not None

    def run(tag: str) -> tuple[str, str]:
        shutil.rmtree(tmp_path / "cache" / "skeletons", ignore_errors=True)  # never seen: the converter runs
        work = tmp_path / tag
        work.mkdir()
        report = repack_checkpoint(llama, drafter, "gemma4-assistant", "bf16", work / "out.gguf", "Q8_0", work,
                                   work / "skeleton.log")
        assert report is not None and report.summary()["proof_bit_exact"]
        return hashlib.sha256((work / "out.gguf").read_bytes()).hexdigest(), (work / "skeleton.log").read_text()

    first, log = run("first")
    assert "read from the tokenizer" in log and kept.is_file()
    again, log = run("again")
    assert f"from {kept}" in log and again == first
    kept.write_bytes(b"not a token list")  # a damaged file is read again from the tokenizer, not trusted
    damaged, log = run("damaged")
    assert "read from the tokenizer" in log and damaged == first
    # Another tokenizer (one token's text changed) is another file.
    other = tmp_path / "other"
    shutil.copytree(drafter, other)
    tok = json.loads((other / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    if isinstance(vocab, dict):
        name = next(k for k in vocab if k.isalpha())
        vocab[name + "x"] = vocab.pop(name)
    else:
        idx = next(i for i, (t, _) in enumerate(vocab) if t.isalpha())
        vocab[idx][0] += "x"
    (other / "tokenizer.json").write_text(json.dumps(tok))
    assert vocab_path(llama, other) != kept
