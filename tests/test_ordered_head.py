"""The assistant's ordered-embedding head in llama.cpp (edgekit's patch 0002), checked against transformers.

The tiny published-structure E2B assistant (ordered embeddings: top 4 of 16 centroids, 32 tokens each) is
converted by edgekit (the patched converter keeps ``masked_embedding.*``) and served by the host llama-server
with one draft token per round, its draft candidates logged; so is a copy of its GGUF without the head
(``edgekit.convert.dense_head``), which llama.cpp drafts from with the full tied head. Every round's top three
candidates and their probabilities (llama.cpp's draft sampler: softmax over the top 10 logits) must be those of
``Gemma4AssistantForCausalLM`` at F32 on the same positions — its centroid-masked head for the GGUF that has
one, its dense head for the copy — and the target's greedy text the same with either drafter and without.
"""

from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from build_helpers import sdist_or_skip
from llama_helpers import host_llama_bin, served

from edgekit.config.recipes import Recipe
from edgekit.convert.dense_head import without_ordered_head
from edgekit.convert.inputs import ensure_synthetic
from edgekit.errors import EdgekitError
from edgekit.prepare.pipeline import ConvertResult, convert_recipe
from edgekit.store import Store

PROMPT = "The quick brown fox jumps over the lazy dog. Once upon a time"
N_PREDICT = 24
CANDIDATE = re.compile(r"draft candidate\s+(\d+), pos\s+(\d+):\s+(\d+) \(\s*([0-9.]+)\)")


@pytest.fixture(scope="module")
def llama_bin() -> Path:
    return host_llama_bin()


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> ConvertResult:
    recipe = Recipe.model_validate({"name": "ordered", "target": {"synthetic": "tiny-gemma4-e2b-tuned", "quant": "F32"},
                                    "drafter": {"synthetic": "tiny-gemma4-e2b-assistant", "quant": "F32"},
                                    "runtime": {"spec_type": "draft-mtp"}, "convert": {"mmproj": "off"}})
    store = Store(tmp_path_factory.getbasetemp() / "edgekit-store")
    return convert_recipe(recipe, store, src=str(sdist_or_skip()))


def complete(url: str, prompt: list[int]) -> dict:
    body = json.dumps({"prompt": prompt, "n_predict": N_PREDICT, "temperature": 0.0, "top_k": 1, "seed": 1,
                       "ignore_eos": True, "cache_prompt": False, "return_tokens": True}).encode()
    req = urllib.request.Request(f"{url}/completion", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read())


def logged_rounds(log: str) -> list[list[tuple[int, float]]]:
    """Each draft round's candidates as llama.cpp logged them: [(token, p), …] best first."""
    rounds: list[list[tuple[int, float]]] = []
    for k, pos, tok, p in CANDIDATE.findall(log):
        assert pos == "0"  # one draft token per round
        if k == "0":
            rounds.append([])
        rounds[-1].append((int(tok), float(p)))
    return rounds


def draft_logits(target: Path, drafter: Path, tokens: list[int], prompt_len: int):  # -> dict[str, Tensor (L, V)]
    """transformers' first draft step at every position, through each of the assistant's heads."""
    import torch

    from edgekit.align.continuations import Continuation
    from edgekit.align.pair import load_pair
    from edgekit.align.teacher import _forward
    from edgekit.align.unroll import head_logits, unroll_states

    pair = load_pair(target, drafter)  # both at F32
    pair.drafter.eval()
    with torch.no_grad():
        batch = _forward(pair, [Continuation(torch.tensor(tokens), prompt_len, True)])
        (state,) = unroll_states(pair.drafter, pair.embed, batch, 1, pair.tokenizer.pad_token_id or 0)
        return {head: head_logits(pair.drafter, state, head)[0].float() for head in ("ordered", "dense")}


def check_rounds(rounds: list[list[tuple[int, float]]], logits, tokens: list[int], prompt_len: int) -> None:
    """Each logged round's candidates are the head's top three, with the draft sampler's probabilities."""
    import torch

    t = prompt_len - 1  # the first round drafts from the prompt's last position and the first sampled token
    for i, got in enumerate(rounds):
        top10 = torch.topk(logits[t], 10)
        probs = torch.softmax(top10.values, dim=0)
        want = [(int(top10.indices[j]), float(probs[j])) for j in range(len(got))]
        assert [tok for tok, _ in got] == [tok for tok, _ in want], (i, t, got, want)
        assert [p for _, p in got] == pytest.approx([p for _, p in want], abs=2e-3), (i, t, got, want)
        accepted = t + 2 < len(tokens) and got[0][0] == tokens[t + 2]
        t += 1 + accepted


def test_the_ordered_head_drafts_what_transformers_computes(pair: ConvertResult, llama_bin: Path,
                                                             tmp_path: Path) -> None:
    files = {m.role: m.file for m in pair.models}
    head = pair.models[1].artifact.manifest["head"]
    assert head["gguf"] == "ordered" and head["dropped"] == [] and head["gguf_tokens_scored"] == 128
    dense = without_ordered_head(files["drafter"], tmp_path / "drafter-dense.gguf")
    with pytest.raises(EdgekitError, match="has no ordered-embedding head to drop"):
        without_ordered_head(dense, tmp_path / "again.gguf")

    target_dir = ensure_synthetic("tiny-gemma4-e2b-tuned", 0)
    drafter_dir = ensure_synthetic("tiny-gemma4-e2b-assistant", 0)
    from transformers import AutoTokenizer

    prompt = AutoTokenizer.from_pretrained(target_dir)(PROMPT).input_ids
    answers = {}
    for name, drafter in (("plain", None), ("ordered", files["drafter"]), ("dense", dense)):
        with served(llama_bin, files["target"], drafter, tmp_path / f"{name}.log", draft_n_max=1,
                    verbose=True) as url:
            answers[name] = complete(url, prompt)
    assert answers["ordered"]["tokens"] == answers["dense"]["tokens"] == answers["plain"]["tokens"]  # lossless
    assert len(answers["plain"]["tokens"]) == N_PREDICT

    tokens = prompt + answers["plain"]["tokens"]
    logits = draft_logits(target_dir, drafter_dir, tokens, len(prompt))
    rounds = {h: logged_rounds((tmp_path / f"{h}.log").read_text(errors="replace")) for h in ("ordered", "dense")}
    for h in ("ordered", "dense"):  # each GGUF drafts with its own head, as transformers computes it
        assert rounds[h] and answers[h]["timings"]["draft_n"] == len(rounds[h])
        check_rounds(rounds[h], logits[h], tokens, len(prompt))
    # and the two heads draft differently: the comparison above tells them apart
    assert sum(a[0][0] != b[0][0] for a, b in zip(rounds["ordered"], rounds["dense"], strict=False)) \
        > len(rounds["ordered"]) // 2
