"""The assistant's ordered head on llama.cpp (edgekit's patch 0002) against its dense head, paired in one run.

Both parts serve the same drafter weights from two GGUFs, with the same host llama-server (the binary an x86
simulated board runs): edgekit's conversion, which keeps the ordered-embedding head, and its copy without it
(``edgekit.convert.dense_head``), which llama.cpp drafts from with the full tied head.

- ``shape``: an assistant of the published E2B assistant's head shape — vocabulary 262,144, hidden 256,
  intermediate 2,048, four layers, 2,048 centroids, top 32 — beside a small target of the same vocabulary,
  random weights (their acceptance is no one's; their time is), Q8_0. Per repetition, ordered then dense
  (order swapped every other repetition), the same prompts, greedy, three draft tokens per round: time per
  draft call (llama.cpp's own speculative statistics: draft time ÷ draft calls) and tok/s with the drafter.
  The ratios are ordered ÷ dense of the same repetition.
- ``acceptance``: ``sim-e2b-mtp`` (the tiny E2B-structure pair, its assistant aligned), held-out prompts,
  greedy: drafts accepted with each head on llama-server, and on LiteRT-LM (edgekit's bundle: ordered head).

    python benchmarks/ordered_head.py [--parts shape,acceptance] [--repeat 3] [--prompts 12] [--json out.json]

Models, conversions and the alignment are cached (the store, ~/.cache/edgekit): a second run only measures.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from edgekit.align.prompts import load_prompts
from edgekit.build import host_build_for_tests
from edgekit.config.recipes import Recipe, load_recipe
from edgekit.convert import litert_run
from edgekit.convert.dense_head import without_ordered_head
from edgekit.paths import cache_dir
from edgekit.prepare.pipeline import convert_recipe
from edgekit.sim.procs import free_port
from edgekit.store import Store

VOCAB = 262_144  # the published E2B assistant's head
E2B_HEAD = {"hidden_size": 256, "intermediate_size": 2048, "num_attention_heads": 4}
CENTROIDS = (2048, 32)
STATS = re.compile(r"#calls\(b,g,a\) =\s*(\d+)\s+(\d+)\s+(\d+).*#gen tokens =\s*(\d+).*dur\(b,g,a\) = "
                   r"([0-9.]+), ([0-9.]+), ([0-9.]+) ms")
SHAPE_PROMPTS = ["The quick brown fox jumps over the lazy dog.", "Once upon a time there was a robot",
                 "def fibonacci(n):", "The capital of France is"]


class Server:
    """llama-server with the target and a drafter; its speculative statistics are read from its log at exit."""

    def __init__(self, target: Path, drafter: Path | None, log: Path, threads: int = 2) -> None:
        self.port, self.log = free_port(), log
        argv = [str(host_build_for_tests().bin_dir / "llama-server"), "-m", str(target), "-ngl", "0", "-c", "1024",
                "-t", str(threads), "--host", "127.0.0.1", "--port", str(self.port), "--no-warmup", "-v"]
        if drafter is not None:
            argv += ["-md", str(drafter), "--spec-type", "draft-mtp", "--spec-draft-n-max", "3", "-ngld", "0"]
        with open(log, "wb") as fh:  # the server keeps its own descriptor
            self.proc = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2):
                    return
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise SystemExit(f"llama-server did not start: {log.read_text(errors='replace')[-1500:]}") from None
                time.sleep(0.2)

    def complete(self, prompt: str, n: int) -> dict[str, Any]:
        body = json.dumps({"prompt": prompt, "n_predict": n, "temperature": 0, "cache_prompt": False,
                           "ignore_eos": True}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}/completion", body,
                                     {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=600) as resp:
            return json.loads(resp.read())["timings"]

    def stop(self) -> dict[str, float] | None:
        self.proc.terminate()
        self.proc.wait(timeout=30)
        found = STATS.findall(self.log.read_text(errors="replace"))
        if not found:
            return None
        _b, g_calls, _a, gen_tokens, _tb, tg, _ta = (float(x) for x in found[-1])
        return {"draft_calls": g_calls, "draft_tokens": gen_tokens, "draft_ms": tg,
                "ms_per_draft_call": tg / g_calls if g_calls else None}


def run_prompts(target: Path, drafter: Path, prompts: list[str], n: int, log: Path) -> dict[str, Any]:
    server = Server(target, drafter, log)
    try:
        timings = [server.complete(p, n) for p in prompts]
    finally:
        stats = server.stop()
    predicted = sum(t["predicted_n"] for t in timings)
    drafted = sum(t.get("draft_n", 0) for t in timings)
    per_prompt = [t["draft_n_accepted"] / t["draft_n"] for t in timings if t.get("draft_n")]
    return {"tokens_per_second": 1000 * predicted / sum(t["predicted_ms"] for t in timings),
            "draft_n": drafted, "draft_n_accepted": sum(t.get("draft_n_accepted", 0) for t in timings),
            "acceptance": sum(t.get("draft_n_accepted", 0) for t in timings) / drafted if drafted else None,
            # LiteRT-LM reports a rate per prompt: their mean is what compares with it
            "acceptance_mean_over_prompts": sum(per_prompt) / len(per_prompt) if per_prompt else None,
            **(stats or {})}


def e2b_shaped_pair(root: Path) -> tuple[Path, Path]:
    """A small target and an assistant with the published E2B assistant's head, vocabulary 262,144."""
    from edgekit.tinymodels import published

    target, drafter = root / "target", root / "assistant"
    if not (target / "config.json").is_file():
        published.make_target(target, "e2b", seed=0, vocab=VOCAB)
    if not (drafter / "config.json").is_file():
        published.make_assistant(drafter, "e2b", seed=0, vocab=VOCAB, text=E2B_HEAD, centroids=CENTROIDS)
    return target, drafter


def shape_part(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    target_dir, drafter_dir = e2b_shaped_pair(cache_dir() / "benchmarks" / "e2b-shaped-head")
    recipe = Recipe.model_validate({"name": "e2b-shaped-head", "target": {"path": str(target_dir), "quant": "Q8_0"},
                                    "drafter": {"path": str(drafter_dir), "quant": "Q8_0"},
                                    "runtime": {"spec_type": "draft-mtp"}, "convert": {"mmproj": "off"}})
    files = {m.role: m.file for m in convert_recipe(recipe, Store()).models}
    heads = {"ordered": files["drafter"], "dense": without_ordered_head(files["drafter"], tmp / "dense.gguf")}
    reps: list[dict[str, Any]] = []
    for r in range(args.repeat):
        order = ["ordered", "dense"] if r % 2 == 0 else ["dense", "ordered"]
        rep = {h: run_prompts(files["target"], heads[h], SHAPE_PROMPTS, args.n_predict, tmp / f"{h}-{r}.log")
               for h in order}
        rep["ratio_ms_per_draft_call"] = rep["ordered"]["ms_per_draft_call"] / rep["dense"]["ms_per_draft_call"]
        rep["ratio_tokens_per_second"] = rep["ordered"]["tokens_per_second"] / rep["dense"]["tokens_per_second"]
        reps.append(rep)
        print(f"repetition {r + 1}: draft call {rep['ordered']['ms_per_draft_call']:.3f} ms ordered, "
              f"{rep['dense']['ms_per_draft_call']:.3f} ms dense ({rep['ratio_ms_per_draft_call']:.3f}×); "
              f"tok/s {rep['ordered']['tokens_per_second']:.1f} / {rep['dense']['tokens_per_second']:.1f} "
              f"({rep['ratio_tokens_per_second']:.3f}×)", flush=True)
    return {"vocab": VOCAB, "assistant": {**E2B_HEAD, "num_centroids": CENTROIDS[0], "top_k": CENTROIDS[1]},
            "quant": "Q8_0", "prompts": len(SHAPE_PROMPTS), "n_predict": args.n_predict, "draft_n_max": 3,
            "repetitions": reps,
            "ms_per_draft_call_ratio": statistics.median(r["ratio_ms_per_draft_call"] for r in reps),
            "tokens_per_second_ratio": statistics.median(r["ratio_tokens_per_second"] for r in reps)}


def acceptance_part(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    prompts = list(load_prompts().heldout)[: args.prompts]
    result = convert_recipe(load_recipe("sim-e2b-mtp"), Store())
    files = {m.role: m.file for m in result.models}
    heads = {"ordered": files["drafter"], "dense": without_ordered_head(files["drafter"], tmp / "e2b-dense.gguf")}
    served = {h: run_prompts(files["target"], heads[h], prompts, 32, tmp / f"acc-{h}.log") for h in heads}
    rates = [litert_run.generate(Path(result.litert[0]["file"]), p, 32, tmp / f"lite{i}", speculative=True)
             .acceptance or 0.0 for i, p in enumerate(prompts)]
    return {"recipe": "sim-e2b-mtp", "prompts": len(prompts), "n_predict": 32, "draft_n_max": 3,
            "llama_server": served, "litert_lm": {"head": "ordered", "acceptance": sum(rates) / len(rates)}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parts", default="shape,acceptance")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--prompts", type=int, default=12)
    ap.add_argument("--n-predict", type=int, default=64)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    doc: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="edgekit-heads-") as tmp:
        if "shape" in parts:
            doc["shape"] = shape_part(args, Path(tmp))
        if "acceptance" in parts:
            doc["acceptance"] = acceptance_part(args, Path(tmp))
    if "shape" in doc:
        s = doc["shape"]
        print(f"\nordered ÷ dense head, E2B-shaped assistant (vocabulary {VOCAB:,}), medians of {args.repeat} paired "
              f"repetitions: time per draft call {s['ms_per_draft_call_ratio']:.3f}× (goal ≤ 0.3×); tok/s with the "
              f"drafter {s['tokens_per_second_ratio']:.3f}×")
    print(json.dumps(doc, indent=2))
    if args.json:
        args.json.write_text(json.dumps(doc, indent=2) + "\n")
    if "acceptance" in doc:
        a = doc["acceptance"]
        print(f"\n| engine | head | accepted, mean over the same {a['prompts']} prompts (greedy, 32 tokens) | pooled |"
              "\n| --- | --- | --- | --- |")
        for h in ("ordered", "dense"):
            s = a["llama_server"][h]
            print(f"| llama-server | {h} | {s['acceptance_mean_over_prompts']:.1%} | {s['acceptance']:.1%} "
                  f"({s['draft_n_accepted']}/{s['draft_n']}) |")
        print(f"| LiteRT-LM | ordered | {a['litert_lm']['acceptance']:.1%} | – |")


if __name__ == "__main__":
    main()
