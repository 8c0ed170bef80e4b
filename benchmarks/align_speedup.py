"""llama-server tokens per second with an aligned MTP drafter vs without, on a simulated board.

A Gemma 4 target larger than the tiny one (hidden 512, 8 layers, a 4096-token vocabulary by default;
~37 M parameters, so one decode step costs real CPU time) and a 4-layer Gemma4AssistantForCausalLM
drafter (hidden 256), both random-weight. Two targets of that architecture:

    random  the random weights as they are: near-hard attention on random keys and flat next-token
            distributions, a function of the whole context that no small drafter can follow;
    tuned   the same weights fine-tuned on the bundled prompt text for a few minutes of CPU (a user's
            fine-tuned target, which is what alignment is for).

For each target the recipe is served three ways, one simulated board each: no drafter (spec_type
none), the random drafter, and the drafter aligned to that target by `edgekit drafter align`. The
boards are asked in turn, prompt by prompt (greedy, held-out prompts), so load from elsewhere on a
shared machine hits the three alike. Reported per way: llama-server's tokens per second
(timings.predicted_n / predicted_ms), draft_n_accepted / draft_n and the tokens per verify pass;
plus the alignment's own held-out numbers (replayed rounds and transformers' assisted generation).
Models, tuned target and aligned drafters are cached, so a second run only measures.

    python benchmarks/align_speedup.py [--hidden 512] [--layers 8] [--vocab 4096] [--tune-steps 150]
                                       [--align-steps 300] [--server-threads 2] [--json out.json]
    python benchmarks/align_speedup.py --tiny     # the tiny pair: replay, transformers and llama-server
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from edgekit.align.prompts import load_prompts
from edgekit.align.run import AlignJob, align
from edgekit.align.server import complete, server_acceptance
from edgekit.config.align_spec import AlignSpec
from edgekit.convert.inputs import ModelInput
from edgekit.paths import cache_dir
from edgekit.tinymodels.tokenizer import write_tokenizer
from edgekit.tinymodels.tuned import finetune_target

SPECIALS = {"pad_token_id": 0, "eos_token_id": 1, "bos_token_id": 2}


def make_pair(out: Path, hidden: int, layers: int, vocab: int, seed: int = 0) -> tuple[Path, Path]:
    """A random Gemma 4 target (sliding/full alternating, half the layers KV-shared) and its assistant."""
    import torch
    from transformers import (
        Gemma4AssistantConfig,
        Gemma4AssistantForCausalLM,
        Gemma4Config,
        Gemma4ForConditionalGeneration,
        Gemma4TextConfig,
    )

    from edgekit.models.hfcompat import patch_transformers

    patch_transformers()
    target_dir, drafter_dir = out / "target-random", out / "drafter-random"
    if (target_dir / "config.json").is_file() and (drafter_dir / "config.json").is_file():
        return target_dir, drafter_dir
    heads, kv_heads, head_dim = hidden // 64, 2, 64
    common = {"num_key_value_heads": kv_heads, "head_dim": head_dim, "global_head_dim": 2 * head_dim,
              "sliding_window": 128, "final_logit_softcapping": 30.0, "max_position_embeddings": 4096, **SPECIALS}
    text = Gemma4TextConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=4 * hidden,
                            num_hidden_layers=layers, num_attention_heads=heads,
                            layer_types=["sliding_attention", "full_attention"] * (layers // 2),
                            vocab_size_per_layer_input=vocab, hidden_size_per_layer_input=64,
                            num_kv_shared_layers=layers // 2, **common)
    torch.manual_seed(seed)
    target = Gemma4ForConditionalGeneration(Gemma4Config(text_config=text, vision_config=None, audio_config=None,
                                                         **SPECIALS))
    target.to(torch.bfloat16).save_pretrained(target_dir)
    d_hidden = hidden // 2
    d_text = Gemma4TextConfig(vocab_size=vocab, hidden_size=d_hidden, intermediate_size=4 * d_hidden,
                              num_hidden_layers=4, num_attention_heads=d_hidden // 64,
                              layer_types=["sliding_attention", "full_attention"] * 2, vocab_size_per_layer_input=0,
                              hidden_size_per_layer_input=0, num_kv_shared_layers=4, **common)
    torch.manual_seed(seed + 1)
    drafter = Gemma4AssistantForCausalLM(Gemma4AssistantConfig(text_config=d_text, backbone_hidden_size=hidden,
                                                               **SPECIALS))
    drafter.generation_config.num_assistant_tokens = 3
    drafter.to(torch.bfloat16).save_pretrained(drafter_dir)
    for d in (target_dir, drafter_dir):
        write_tokenizer(d, vocab)
    return target_dir, drafter_dir


class SimBoards:
    """Simulated boards in a private directory, stopped on exit (`edgekit sim down`)."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.tmp = Path(tempfile.mkdtemp(prefix="edgekit-align-bench-"))
        self.env = {**os.environ, "EDGEKIT_CONFIG_DIR": str(self.tmp / "config"),
                    "EDGEKIT_SIM_DIR": str(self.tmp / "sim"), "EDGEKIT_CONFIG": str(self.tmp / "config/edgekit.yaml")}

    def edgekit(self, *args: str) -> str:
        res = subprocess.run([sys.executable, "-m", "edgekit", *args], capture_output=True, text=True,
                             env=self.env, check=False, timeout=1800)
        if res.returncode != 0:
            raise SystemExit(f"edgekit {' '.join(args)} failed:\n{res.stderr[-3000:]}")
        return res.stdout

    def __enter__(self) -> SimBoards:
        state = json.loads(self.edgekit("sim", "up", "--boards", str(self.count), "--json"))
        self.boards = [(b["name"], f"http://127.0.0.1:{b['service_port']}") for b in state["boards"]]
        return self

    def __exit__(self, *exc: object) -> None:
        self.edgekit("sim", "down")

    def serve(self, board: int, name: str, target: Path, drafter: Path | None, threads: int) -> str:
        """Deploy target (+ drafter) as one recipe on board number ``board``; its URL."""
        runtime = {"ctx_size": 1024, "parallel": 1, "port": 8080, "spec_type": "draft-mtp" if drafter else "none",
                   "draft_n_max": 3, "llama_cpp": {"n_gpu_layers": 0, "n_gpu_layers_draft": 0, "threads": threads}}
        recipe = {"name": name, "target": {"path": str(target), "quant": "F32"}, "runtime": runtime}
        if drafter is not None:
            recipe["drafter"] = {"path": str(drafter), "quant": "F32"}
        path = self.tmp / f"{name}.yaml"
        path.write_text(yaml.safe_dump(recipe))
        board_name, url = self.boards[board]
        self.edgekit("--json", "deploy", "--board", board_name, "--recipe", str(path))
        return url


def measure(urls: dict[str, str], prompts: list[str], n_predict: int, repeat: int = 2) -> dict[str, dict[str, Any]]:
    """Greedy decodes of every prompt on every server, interleaved prompt by prompt (so load from other
    processes on a shared machine hits all ways alike), ``repeat`` passes; tokens per second overall."""
    for url in urls.values():
        complete(url, prompts[0], 8)  # warm-up: first-request allocations are not decode speed
    parts: dict[str, list[dict[str, Any]]] = {way: [] for way in urls}
    for _ in range(repeat):
        for prompt in prompts:
            for way, url in urls.items():
                parts[way].append(server_acceptance(url, [prompt], n_predict, k=3))
    out = {}
    for way, ps in parts.items():
        drafted, accepted = sum(p["draft_n"] for p in ps), sum(p["draft_n_accepted"] for p in ps)
        predicted = sum(p["predicted_n"] for p in ps)
        seconds = sum(p["predicted_n"] / p["tokens_per_second"] for p in ps if p["tokens_per_second"])
        rate = accepted / drafted if drafted else 0.0
        out[way] = {"requests": len(ps), "draft_n": drafted, "draft_n_accepted": accepted,
                    "acceptance_rate": round(rate, 4), "tokens_per_verify": round(1 + 3 * rate, 4),
                    "predicted_n": predicted, "tokens_per_second": round(predicted / seconds, 2) if seconds else None}
    return out


def big_cases(args: argparse.Namespace) -> list[tuple[str, Path, Path, AlignSpec]]:
    tag = hashlib.sha256(f"{args.hidden}-{args.layers}-{args.vocab}".encode()).hexdigest()[:12]
    work = cache_dir() / "bench-align" / tag
    random_target, drafter = make_pair(work, args.hidden, args.layers, args.vocab)
    tuned_target = work / f"target-tuned-{args.tune_steps}"
    if not (tuned_target / "config.json").is_file():
        print(f"fine-tuning the target for {args.tune_steps} steps …", file=sys.stderr, flush=True)
        finetune_target(random_target, tuned_target, steps=args.tune_steps, lr=args.tune_lr, batch=8)
    spec = AlignSpec(steps=args.align_steps, lr=args.align_lr, new_tokens=args.n_predict)
    return [("random", random_target, drafter, spec), ("tuned", tuned_target, drafter, spec)]


def tiny_cases() -> list[tuple[str, Path, Path, AlignSpec]]:
    """The tiny pair with the settings of the tests and of sim-tiny-mtp (so the store has them)."""
    from edgekit.convert.inputs import ensure_synthetic

    drafter = ensure_synthetic("tiny-gemma4-assistant", 0)
    spec = AlignSpec(steps=200, lr=0.01)
    return [("tiny random", ensure_synthetic("tiny-gemma4", 0), drafter, spec),
            ("tiny tuned", ensure_synthetic("tiny-gemma4-tuned", 0), drafter, spec)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true", help="the tiny pair instead (all held-out prompts, 1 thread)")
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--tune-steps", type=int, default=150)
    ap.add_argument("--tune-lr", type=float, default=1e-3)
    ap.add_argument("--align-steps", type=int, default=300)
    ap.add_argument("--align-lr", type=float, default=3e-3)
    ap.add_argument("--server-threads", type=int, default=None, help="llama-server threads (default 2; tiny 1)")
    ap.add_argument("--prompts", type=int, default=None, help="held-out prompts per measurement (24; tiny all)")
    ap.add_argument("--n-predict", type=int, default=None, help="tokens per request (64; tiny 48)")
    ap.add_argument("--repeat", type=int, default=2, help="passes over the prompts")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    threads = args.server_threads or (1 if args.tiny else 2)
    args.n_predict = args.n_predict or (48 if args.tiny else 64)
    held = list(load_prompts().heldout)
    prompts = held[: args.prompts or (len(held) if args.tiny else 24)]

    t0 = time.monotonic()
    cases = tiny_cases() if args.tiny else big_cases(args)
    print(f"models ready in {time.monotonic() - t0:.0f} s", file=sys.stderr, flush=True)
    results: dict[str, Any] = {"config": vars(args) | {"json": None}, "targets": {}}
    aligned: dict[str, Any] = {}
    for name, target, drafter, spec in cases:
        job = AlignJob(ModelInput("target", target, {"path": str(target)}),
                       ModelInput("drafter", drafter, {"path": str(drafter)}), spec, k=3,
                       assisted_prompts=len(prompts) if args.tiny else 8)
        print(f"aligning the drafter to the {name} target …", file=sys.stderr, flush=True)
        aligned[name] = align(job, say=lambda m: print(f"  {m}", file=sys.stderr, flush=True))
    with SimBoards(3) as boards:
        for name, target, drafter, _spec in cases:
            outcome = aligned[name]
            m = outcome.artifact.manifest
            row: dict[str, Any] = {"alignment": {"seconds": m["seconds"], "train_seconds": m["train"]["seconds"],
                                                 "cached": outcome.cached, "heldout": m["heldout"],
                                                 "assisted": m["assisted"]}}
            urls = {}
            ways = (("no drafter", None), ("random drafter", drafter), ("aligned drafter", outcome.path))
            for i, (way, model) in enumerate(ways):
                print(f"serving the {name} target, {way} …", file=sys.stderr, flush=True)
                urls[way] = boards.serve(i, f"bench-{name.replace(' ', '-')}-{way.split()[0]}", target, model,
                                         threads)
            row.update(measure(urls, prompts, args.n_predict, args.repeat))
            base = row["no drafter"]["tokens_per_second"]
            for way in ("random drafter", "aligned drafter"):
                row[way]["speedup"] = round(row[way]["tokens_per_second"] / base, 3) if base else None
            results["targets"][name] = row
    results["seconds"] = round(time.monotonic() - t0, 1)
    report(results)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


def report(results: dict[str, Any]) -> None:
    for name, row in results["targets"].items():
        a = row["alignment"]
        print(f"\n{name} target — alignment {a['seconds']:.0f} s ({a['train_seconds']:.0f} s training"
              f"{', cached' if a['cached'] else ''})")
        print(f"  {'':28} {'accepted':>9} {'per position t+1, t+2, t+3':>28} {'tok/verify':>10}")
        for when in ("before", "after"):
            for how, src in (("replay", a["heldout"][when]), ("transformers", (a["assisted"] or {}).get(when))):
                if src:
                    per = ", ".join(f"{p:.0%}" for p in src["per_position"])
                    print(f"  {when + ' (' + how + ')':28} {src['acceptance_rate']:9.1%} {per:>28} "
                          f"{src['tokens_per_verify']:10.2f}")
        print(f"  {'llama-server':16} {'tok/s':>8} {'speedup':>8} {'accepted':>9} {'tok/verify':>10}")
        for way in ("no drafter", "random drafter", "aligned drafter"):
            r = row[way]
            drafted = bool(r["draft_n"])
            print(f"  {way:16} {r['tokens_per_second']:8.1f} {r.get('speedup') or 1.0:8.2f} "
                  f"{r['acceptance_rate'] if drafted else 0:9.1%} {r['tokens_per_verify'] if drafted else 1.0:10.2f}")


if __name__ == "__main__":
    main()
