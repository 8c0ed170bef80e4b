"""Model inputs and their validation: each bad input is one clear error before any conversion."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from cli_helpers import edgekit

from edgekit.config.recipes import ModelSource
from edgekit.convert.inputs import resolve
from edgekit.errors import EdgekitError
from edgekit.models.validate import check_pair, inspect_model
from edgekit.tinymodels.legacy import ensure_tiny_pair


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return ensure_tiny_pair(tmp_path_factory.getbasetemp() / "edgekit-tiny", seed=0, qat=False)


def _copy(src: Path, dst: Path, edit: Callable[[Path], None]) -> Path:
    shutil.copytree(src, dst)
    edit(dst)
    return dst


def _edit_config(change: Callable[[dict], None]) -> Callable[[Path], None]:
    def edit(d: Path) -> None:
        cfg = json.loads((d / "config.json").read_text())
        change(cfg)
        (d / "config.json").write_text(json.dumps(cfg))

    return edit


def test_the_tiny_pair_is_valid(pair: tuple[Path, Path]) -> None:
    target, drafter = pair
    t, d = inspect_model(target, "target"), inspect_model(drafter, "drafter")
    check_pair(t, d)
    assert (t.architecture, t.gguf_arch, t.hidden_size) == ("Gemma4ForConditionalGeneration", "gemma4", 64)
    assert (d.gguf_arch, d.backbone_hidden_size, d.vocab_size) == ("gemma4-assistant", 64, t.vocab_size)
    assert t.dtypes == ("BF16",)


@pytest.mark.parametrize(
    ("role", "which", "edit", "message"),
    [
        ("target", 0, _edit_config(lambda c: c.update(architectures=["LlamaForCausalLM"])),
         "architecture LlamaForCausalLM"),
        ("drafter", 1, _edit_config(lambda c: c.pop("backbone_hidden_size")), "no backbone_hidden_size"),
        ("target", 0, lambda d: (d / "config.json").unlink(), "no config.json"),
        ("target", 0, lambda d: (d / "config.json").write_text("{nope"), "not valid JSON"),
        ("target", 0, lambda d: (d / "model.safetensors").unlink(), "no .safetensors weights"),
        ("target", 0, lambda d: (d / "tokenizer.json").unlink(), "no tokenizer"),
        ("drafter", 1, lambda d: (d / "model.safetensors.index.json").write_text(
            json.dumps({"weight_map": {"a": "model-00002-of-00002.safetensors"}})), "missing 1 weight file"),
        ("target", 0, lambda d: os.truncate(d / "model.safetensors", (d / "model.safetensors").stat().st_size // 2),
         "truncated"),
        ("target", 0, lambda d: os.truncate(d / "model.safetensors", 5), "truncated"),
    ],
    ids=["wrong-arch", "no-backbone", "no-config", "bad-json", "no-weights", "no-tokenizer", "missing-shard",
         "truncated", "truncated-header"],
)
def test_bad_model_dirs_fail_with_one_clear_error(pair: tuple[Path, Path], tmp_path: Path, role: str, which: int,
                                                  edit: Callable[[Path], None], message: str) -> None:
    bad = _copy(pair[which], tmp_path / "m", edit)
    with pytest.raises(EdgekitError, match=message) as info:
        inspect_model(bad, role)
    assert "\n" not in str(info.value)


def test_swapped_roles_say_so(pair: tuple[Path, Path]) -> None:
    with pytest.raises(EdgekitError, match="swap target and drafter"):
        inspect_model(pair[1], "target")


def test_drafter_for_another_target_is_refused(pair: tuple[Path, Path], tmp_path: Path) -> None:
    target = inspect_model(pair[0], "target")
    wide = _copy(pair[1], tmp_path / "wide", _edit_config(lambda c: c.update(backbone_hidden_size=1536)))
    with pytest.raises(EdgekitError, match=r"hidden size 1536.*has 64"):
        check_pair(target, inspect_model(wide, "drafter"))
    other_vocab = _copy(pair[1], tmp_path / "vocab", _edit_config(lambda c: c["text_config"].update(vocab_size=999)))
    with pytest.raises(EdgekitError, match="vocabulary of 999"):
        check_pair(target, inspect_model(other_vocab, "drafter"))


def test_local_path_source_is_fingerprinted(pair: tuple[Path, Path], tmp_path: Path) -> None:
    copy = _copy(pair[0], tmp_path / "t", lambda d: None)
    first = resolve(ModelSource(path=str(copy)), "target")
    assert first.path == copy.resolve() and first.identity["fingerprint"]
    (copy / "generation_config.json").write_text("{}")
    assert resolve(ModelSource(path=str(copy)), "target").identity != first.identity
    with pytest.raises(EdgekitError, match="does not exist"):
        resolve(ModelSource(path=str(tmp_path / "nothing")), "target")


def _recipe(path: Path, target: str, drafter: str) -> Path:
    path.write_text(f"name: t\ntarget:\n  {target}\n  quant: F32\ndrafter:\n  {drafter}\n  quant: F32\n"
                    "runtime:\n  spec_type: draft-mtp\n")
    return path


def test_cli_mismatch_is_one_line_exit_2_before_converting(pair: tuple[Path, Path], tmp_path: Path) -> None:
    wide = _copy(pair[1], tmp_path / "wide", _edit_config(lambda c: c.update(backbone_hidden_size=128)))
    recipe = _recipe(tmp_path / "r.yaml", f"path: {pair[0]}", f"path: {wide}")
    store = tmp_path / "store"
    res = edgekit("convert", "--recipe", str(recipe), env={**os.environ, "EDGEKIT_STORE": str(store)}, timeout=300)
    assert res.returncode == 2, res.stderr
    assert res.stderr.startswith("edgekit: The drafter wide was trained for a target of hidden size 128")
    assert "Traceback" not in res.stderr and len(res.stderr.strip().splitlines()) == 1
    assert not store.exists() or not any(store.rglob("*.gguf"))


def test_cli_offline_hub_repo_not_in_cache(tmp_path: Path) -> None:
    recipe = _recipe(tmp_path / "r.yaml", "repo: google/gemma-4-E2B-it\n  revision: main",
                     "repo: google/gemma-4-E2B-it-assistant\n  revision: main")
    res = edgekit("convert", "--recipe", str(recipe), timeout=300,
                  env={**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf"),
                       "EDGEKIT_STORE": str(tmp_path / "s")})
    assert res.returncode == 2
    assert "HF_HUB_OFFLINE is set and it is not in the cache" in res.stderr and "Traceback" not in res.stderr
