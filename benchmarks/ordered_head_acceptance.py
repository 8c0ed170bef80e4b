"""Draft acceptance of the published-structure assistant: its ordered head (LiteRT-LM) vs the full head (llama.cpp).

`sim-e2b-mtp` (tiny E2B-structure target fine-tuned on text; its assistant with ordered embeddings, aligned
by `edgekit drafter align`) is converted both ways from the same aligned checkpoint: the GGUF pair, whose
drafter llama.cpp's converter strips of the centroids (full tied head), and the `.litertlm` bundle, whose
drafter edgekit exports with the centroid-masked head. The same held-out prompts go greedily to the host
llama-server (`/completion`, `draft_n_accepted / draft_n`) and to LiteRT-LM's CPU engine (its
`MTP Drafter - Success rate`, averaged over prompts). Converting and aligning are cached in the store, so a
second run only measures.

    python benchmarks/ordered_head_acceptance.py [--prompts 12] [--n-predict 32] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from edgekit.align.prompts import load_prompts
from edgekit.align.server import server_acceptance
from edgekit.build import host_build_for_tests
from edgekit.config.recipes import load_recipe
from edgekit.convert import litert_run
from edgekit.prepare.pipeline import convert_recipe
from edgekit.store import Store


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def llama_server_acceptance(target: Path, drafter: Path, prompts: list[str], n: int, log: Path) -> dict[str, Any]:
    port = _port()
    argv = [str(host_build_for_tests().bin_dir / "llama-server"), "-m", str(target), "-md", str(drafter),
            "--spec-type", "draft-mtp", "--spec-draft-n-max", "3", "-ngl", "0", "-ngld", "0", "-c", "512",
            "-t", "1", "--host", "127.0.0.1", "--port", str(port), "--no-warmup"]
    with open(log, "wb") as fh:
        proc = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                    break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"llama-server did not start: {log.read_text()[-1500:]}") from None
                time.sleep(0.2)
        out = server_acceptance(f"http://127.0.0.1:{port}", prompts, n, 3)
        out.pop("tokens")
        return out
    finally:
        proc.terminate()
        proc.wait(timeout=15)


def litert_acceptance(bundle: Path, prompts: list[str], n: int, work: Path) -> dict[str, Any]:
    rates = []
    for i, prompt in enumerate(prompts):
        rates.append(litert_run.generate(bundle, prompt, n, work / f"r{i}", speculative=True).acceptance or 0.0)
    return {"prompts": len(prompts), "acceptance_rate": round(sum(rates) / len(rates), 4),
            "per_prompt": [round(r, 4) for r in rates]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=12)
    ap.add_argument("--n-predict", type=int, default=32)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    prompts = list(load_prompts().heldout)[: args.prompts]
    result = convert_recipe(load_recipe("sim-e2b-mtp"), Store())
    files = {m.role: m.file for m in result.models}
    bundle = Path(result.litert[0]["file"])
    drafter = next(m for m in result.models if m.role == "drafter")
    with tempfile.TemporaryDirectory(prefix="edgekit-heads-") as tmp:
        served = llama_server_acceptance(files["target"], files["drafter"], prompts, args.n_predict,
                                         Path(tmp) / "server.log")
        lite = litert_acceptance(bundle, prompts, args.n_predict, Path(tmp))
    doc = {"recipe": "sim-e2b-mtp", "prompts": len(prompts), "n_predict": args.n_predict, "draft_n_max": 3,
           "llama_server": {"head": "dense (all tokens; centroids dropped by the converter)", **served},
           "litert_lm": {"head": "ordered (top-k centroids' tokens)", **lite},
           "gguf_head": drafter.artifact.manifest.get("head"), "drafter_source": drafter.artifact.manifest["source"]}
    print(json.dumps(doc, indent=2))
    if args.json:
        args.json.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"\n| engine | head | accepted (same {len(prompts)} prompts, greedy, {args.n_predict} tokens) |")
    print("| --- | --- | --- |")
    print(f"| llama-server | dense | {served['acceptance_rate']:.1%} ({served['draft_n_accepted']}/"
          f"{served['draft_n']} drafts) |")
    print(f"| LiteRT-LM | ordered | {lite['acceptance_rate']:.1%} (mean over prompts) |")


if __name__ == "__main__":
    main()
