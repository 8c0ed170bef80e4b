"""Drafter alignment on the tiny Gemma 4 pair: the training graph, the grid, refusals, resume, determinism."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from cli_helpers import EDGEKIT, edgekit  # noqa: E402

from edgekit.align import grid  # noqa: E402
from edgekit.align.continuations import Continuation  # noqa: E402
from edgekit.align.objective import AcceptanceCounts, acceptance  # noqa: E402
from edgekit.align.pair import check_models, load_pair  # noqa: E402
from edgekit.align.prompts import load_prompts, parse_prompts  # noqa: E402
from edgekit.align.teacher import Teacher  # noqa: E402
from edgekit.align.unroll import unroll  # noqa: E402
from edgekit.convert.inputs import ensure_synthetic  # noqa: E402
from edgekit.errors import EdgekitError  # noqa: E402

RUNTIME = {"ctx_size": 512, "spec_type": "draft-mtp", "draft_n_max": 3, "parallel": 1, "port": 8080,
           "llama_cpp": {"n_gpu_layers": 0, "n_gpu_layers_draft": 0, "threads": 1}}


@pytest.fixture(scope="module")
def tiny() -> tuple[Path, Path]:
    return ensure_synthetic("tiny-gemma4", 0), ensure_synthetic("tiny-gemma4-assistant", 0)


@pytest.fixture(scope="module")
def pair(tiny):
    torch.set_num_threads(1)
    return load_pair(*tiny)


def write_recipe(path: Path, target: dict, drafter: dict) -> Path:
    path.write_text(yaml.safe_dump({"name": path.stem, "target": target, "drafter": drafter, "runtime": RUNTIME}))
    return path


def test_training_graph_is_the_inference_graph(pair) -> None:
    """Row t of the batched unroll equals transformers' own drafter forward for a round drafted after t."""
    tokens = torch.tensor([2, *range(40, 52)])  # 13 tokens: every KV position inside the sliding window
    batch = Teacher(pair, [Continuation(tokens, 3, True)]).batch([0])
    with torch.no_grad():
        steps = unroll(pair.drafter, pair.embed, batch, k=3)
        for t in (2, 6, 9):
            kv = {name: (k[:, :, : t + 1], v[:, :, : t + 1]) for name, (k, v) in batch.kv.items()}
            state, token = batch.hidden[:, t : t + 1], tokens[t + 1 : t + 2][None]
            for j in range(3):
                out = pair.drafter(inputs_embeds=torch.cat([pair.embed(token), state], -1), shared_kv_states=kv,
                                   position_ids=torch.tensor([[t + 1]]))
                torch.testing.assert_close(steps[j][0, t], out.logits[0, 0], rtol=1e-4, atol=1e-5)
                state, token = out.last_hidden_state, tokens[t + j + 2 : t + j + 3][None]


def test_acceptance_replays_a_greedy_decode() -> None:
    """Rounds start after the prompt and move on by accepted + 1, as a server decodes."""
    from edgekit.align.teacher import TeacherBatch

    length, vocab = 12, 10
    top = torch.tensor([(t % 5) + 3 for t in range(length)])  # the target's greedy token after position t
    ids = torch.cat([torch.tensor([2, 9]), top[1:-1]])[None]  # prompt of 2, then the target's greedy path
    logprobs = torch.full((1, length, vocab), -20.0)
    logprobs[0, torch.arange(length), top] = 0.0
    batch = TeacherBatch(ids, torch.tensor([length]), torch.tensor([2]), torch.tensor([True]), logprobs, None, {})
    perfect = [torch.roll(logprobs, -j, dims=1) for j in range(1, 4)]  # step j predicts the token after t + j
    assert acceptance(perfect, batch).accepted == [2, 2, 2]  # rounds after t = 1 and t = 5 keep all 3
    never = acceptance([p.flip(-1) for p in perfect], batch)
    assert never.rounds == 8 and never.accepted == [0, 0, 0]  # t = 1…8, one token each
    s = AcceptanceCounts(3, 4, [2, 1, 0]).summary()
    assert s["per_position"] == [0.5, 0.5, 0.0] and s["tokens_per_verify"] == 1.75 and s["acceptance_rate"] == 0.25


def test_projection_lands_on_the_exact_q4_0_grid() -> None:
    from edgekit.convert.qat import exact_q4_0

    w = torch.randn(64, 96, generator=torch.Generator().manual_seed(0)) * 0.02  # seeded: a test that can repeat
    q = grid.project(w)
    assert exact_q4_0(q.numpy(), threads=1).exact  # the repack's own search finds every block
    assert exact_q4_0(q.to(torch.bfloat16).float().numpy(), threads=1).exact  # and bf16 keeps it
    assert float((q - w).abs().max()) < float(w.abs().max()) / 8  # a close projection, not any grid point


def test_prompt_split_is_stable_and_disjoint(tmp_path: Path) -> None:
    p = load_prompts()
    assert len(p.train) > 100 and len(p.heldout) > 20 and not set(p.train) & set(p.heldout)
    f = tmp_path / "prompts.txt"
    f.write_text("\n".join(reversed([*p.train, *p.heldout])) + "\n# a comment\n\n")
    q = load_prompts(str(f))
    assert set(q.heldout) == set(p.heldout) and q.sha256 != p.sha256
    assert parse_prompts("a\\nb\n#c\n") == ["a\nb"]
    with pytest.raises(EdgekitError, match="at least"):
        f.write_text("one\ntwo\n")
        load_prompts(str(f))


def _mismatched_target(out: Path, hidden: int = 64, vocab: int = 400) -> Path:
    """A real Gemma 4 target of another size (hidden or vocabulary), written like the tiny one."""
    from transformers import Gemma4ForConditionalGeneration

    from edgekit.tinymodels.legacy import target_config
    from edgekit.tinymodels.tokenizer import write_tokenizer

    cfg = target_config(write_tokenizer(out, vocab))
    cfg.text_config.hidden_size = hidden
    Gemma4ForConditionalGeneration(cfg).to(torch.bfloat16).save_pretrained(out)
    return out


@pytest.mark.parametrize(("hidden", "vocab", "words"), [(96, 400, "hidden size"), (64, 512, "vocabulary")])
def test_mismatched_target_is_refused(tmp_path: Path, tiny, hidden: int, vocab: int, words: str) -> None:
    target = _mismatched_target(tmp_path / "target", hidden, vocab)
    with pytest.raises(EdgekitError, match=words):
        check_models(target, tiny[1])
    recipe = write_recipe(tmp_path / "mismatch.yaml", {"path": str(target), "quant": "F32"},
                          {"synthetic": "tiny-gemma4-assistant", "quant": "F32", "align": {"steps": 5}})
    res = edgekit("drafter", "align", "--recipe", str(recipe),
                  env={**os.environ, "EDGEKIT_STORE": str(tmp_path / "store")}, timeout=600)
    assert res.returncode == 2, res.stderr[-2000:]
    assert "Traceback" not in res.stderr and words in res.stderr
    assert len([line for line in res.stderr.splitlines() if line.startswith("edgekit:")]) == 1


def _align_json(recipe: Path, store: Path, *extra: str) -> dict:
    res = edgekit("drafter", "align", "--recipe", str(recipe), "--measure-prompts", "0", "--json", *extra,
                  env={**os.environ, "EDGEKIT_STORE": str(store)}, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout)


def test_interrupted_training_resumes_from_its_checkpoint(tmp_path: Path) -> None:
    """Killed mid-run, the next run continues from the checkpoint and ends bit-identical to a clean run."""
    from edgekit.align.recipe import recipe_job, recipe_spec
    from edgekit.align.run import job_key
    from edgekit.config.recipes import load_recipe
    from edgekit.paths import cache_dir

    recipe = write_recipe(tmp_path / "resume.yaml", {"synthetic": "tiny-gemma4", "quant": "F32"},
                          {"synthetic": "tiny-gemma4-assistant", "quant": "F32",
                           "align": {"steps": 40, "lr": 0.01, "new_tokens": 16, "batch_size": 8}})
    r = load_recipe(str(recipe))
    ckpt = cache_dir() / "align" / job_key(recipe_job(r, recipe_spec(r)))[0][:24] / "checkpoint.pt"
    ckpt.unlink(missing_ok=True)  # left by an earlier killed run of this test
    store = tmp_path / "store"
    proc = subprocess.Popen([*EDGEKIT, "drafter", "align", "--recipe", str(recipe),
                             "--measure-prompts", "0", "--json"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env={**os.environ, "EDGEKIT_STORE": str(store)})
    try:
        deadline = time.monotonic() + 300
        while not ckpt.is_file() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.1)
        assert ckpt.is_file(), "no checkpoint appeared before the run ended"
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait(30)
    resumed = _align_json(recipe, store)
    assert resumed["train"]["resumed_from"] >= 2 and not resumed["cached"]
    assert not ckpt.exists()  # a finished run removes its checkpoint
    clean = _align_json(recipe, tmp_path / "store2")
    assert clean["train"]["resumed_from"] == 0
    assert clean["fingerprint"] == resumed["fingerprint"]  # same weights: deterministic in the seed
    again = _align_json(recipe, store)
    assert again["cached"] and again["path"] == resumed["path"]
    manifest = json.loads((Path(resumed["path"]) / "manifest.json").read_text())
    assert manifest["target"]["fingerprint"] and manifest["settings"]["steps"] == 40
    assert manifest["heldout"]["before"]["k"] == 3 and manifest["data"]["heldout"] > 0


def test_qat_drafter_stays_on_its_grid(tmp_path: Path) -> None:
    recipe = write_recipe(tmp_path / "qat.yaml", {"synthetic": "tiny-gemma4-qat", "quant": "F32"},
                          {"synthetic": "tiny-gemma4-assistant-qat", "quant": "F32",
                           "align": {"steps": 6, "lr": 0.01, "new_tokens": 8}})
    out = _align_json(recipe, tmp_path / "store")
    assert out["qat"]["tensors_on_grid"] > 0
    assert out["qat"]["exact_q4_0_after"] == out["qat"]["tensors_on_grid"]


def test_recipe_align_block_gives_a_drafter_convert_can_use(tmp_path: Path, tiny, monkeypatch) -> None:
    """What convert calls for a drafter with an align block: the store's artifact, a plain HF directory."""
    from edgekit.align.recipe import aligned_drafter
    from edgekit.config.recipes import load_recipe
    from edgekit.convert.inputs import ModelInput, resolve
    from edgekit.models.validate import inspect_model

    monkeypatch.setenv("EDGEKIT_STORE", str(tmp_path / "store"))
    path = write_recipe(tmp_path / "wired.yaml", {"synthetic": "tiny-gemma4", "quant": "F32"},
                        {"synthetic": "tiny-gemma4-assistant", "quant": "F32",
                         "align": {"steps": 3, "lr": 0.01, "new_tokens": 8}})
    r = load_recipe(str(path))
    assert r.drafter is not None and r.drafter.align is not None and r.drafter.align.steps == 3
    target, drafter = resolve(r.target, "target"), resolve(r.drafter, "drafter")
    said: list[str] = []
    first = aligned_drafter(r, target, drafter, said.append)
    assert isinstance(first, ModelInput) and first.role == "drafter" and "aligned" in first.identity
    info = inspect_model(first.path, "drafter")  # what convert checks next
    assert info.architecture == "Gemma4AssistantForCausalLM" and info.backbone_hidden_size == 64
    assert aligned_drafter(r, target, drafter, said.append) == first and any("cached" in m for m in said)
    with pytest.raises(EdgekitError, match="nothing to align it to"):
        aligned_drafter(r, None, drafter)
