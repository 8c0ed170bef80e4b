"""``edgekit verify``: what a conversion costs in quality, as llama.cpp measures it.

Two references, one fixed text, the same token windows (``llama-perplexity --kl-divergence``: mean KL
divergence of the next-token distributions and how often the top-1 token agrees):

- the checkpoint as transformers runs it (:mod:`edgekit.convert.hfreference`): the model as published.
  Every GGUF is scored against it, F32 included, so a conversion or runtime that computes something else
  (a wrong RoPE, MLP width, softcap) shows, and the F32 GGUF must match it (:data:`FAITHFUL`);
- the F32 GGUF run by the same llama.cpp: what the quantization alone costs.

A drafter cannot run without its target, so only targets are measured.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgekit.errors import EdgekitError
from edgekit.paths import logs_dir

# A fixed, plain English text: the same tokens on every run and for every quant type.
_TEXT = """
The history of computing is a story of machines that became smaller, faster and cheaper at once.
Early computers filled rooms and needed teams of engineers to keep them running. Each new
generation of hardware brought more memory and more arithmetic per watt, and software grew to use
all of it. Today a board the size of a paperback book can run a language model that answers
questions, writes code and translates between languages, as long as the model is small enough
and its weights are stored in a compact form.

Quantization is the craft of storing those weights with fewer bits. A weight that took sixteen
bits can often be kept in four or eight bits with little loss, because the model cares about the
overall shape of its weights more than about the last digits of each one. Some models are even
trained with the low precision in mind, so that their weights already sit on a coarse grid of
values. For such a model, a careful conversion loses nothing at all.

Speculative decoding is another way to save time. A small drafter guesses the next few tokens,
and the large model checks the guesses in a single pass. When the guesses are good, the large
model produces several tokens for the price of one. When they are bad, nothing is lost but a
little work, because the output is always the large model's own.

A good measurement tells a person what a choice costs. The size of a file, the speed of a reply,
the energy drawn from the wall and the quality of the answers all belong in the same table, so
that nobody has to guess which trade was made.
"""


# The F32 GGUF against transformers: both compute in float32 (flash attention off, an F32 cache), so only
# accumulation order and ggml's fp16-table GELU separate them (measured ≈ 1e-6 to 4e-5; a window-start or RoPE
# mistake ≥ 1e-3). Top-1 is looser: random tiny models have flat distributions whose near-ties flip (98.5 % on the
# random QAT E2B shape), and an MoE's near-tied routers flip experts on such small differences.
FAITHFUL = {"max_mean_kld": 1e-4, "min_same_top1": 0.95}


@dataclass(frozen=True)
class KldResult:
    model: str
    reference: str
    mean_kld: float
    mean_kld_err: float
    same_top1: float  # fraction of positions where the top-1 token agrees
    ppl: float | None
    ppl_base: float | None
    chunks: int  # windows of ctx tokens; each scores its second half
    ctx: int

    def to_dict(self) -> dict[str, Any]:
        return self.__dict__.copy()


def prompt_text(repeats: int = 4) -> str:
    return (_TEXT.strip() + "\n\n") * repeats


_FLOAT = r"([-+0-9.eE]+|nan|inf)"


def parse_kld(output: str) -> dict[str, float]:
    """Mean KLD, same-top-p and perplexities from llama-perplexity's --kl-divergence report."""
    found: dict[str, float] = {}
    patterns = {"mean_kld": rf"Mean\s+KLD:\s+{_FLOAT}\s+±\s+{_FLOAT}", "same_top1": rf"Same top p:\s+{_FLOAT}",
                "ppl": rf"Mean\s+PPL\(Q\)\s*:\s+{_FLOAT}", "ppl_base": rf"Mean\s+PPL\(base\)\s*:\s+{_FLOAT}"}
    for key, pat in patterns.items():
        m = re.search(pat, output)
        if m:
            found[key] = float(m.group(1))
            if key == "mean_kld":
                found["mean_kld_err"] = float(m.group(2))
    if "mean_kld" not in found or "same_top1" not in found:
        found = _from_last_chunk(output) or found
    if "mean_kld" not in found or "same_top1" not in found:
        raise EdgekitError("llama-perplexity printed no KL divergence summary (is the text long enough for "
                           "two contexts?).")
    found["same_top1"] /= 100.0
    return found


_CHUNK = re.compile(
    rf"^\s*\d+\s+{_FLOAT}\s+±\s+{_FLOAT}\s+{_FLOAT}\s+±\s+{_FLOAT}\s+{_FLOAT}\s+±\s+{_FLOAT}"
    rf"\s+{_FLOAT}\s+±\s+{_FLOAT}\s*%\s+{_FLOAT}\s+±\s+{_FLOAT}\s*%\s*$", re.MULTILINE)


def _from_last_chunk(output: str) -> dict[str, float] | None:
    """The running totals of the last per-chunk line.

    llama-perplexity logs its final summary through an asynchronous logger that, now and then,
    exits before flushing it; the last chunk line carries the same running means (fewer digits).
    """
    rows = _CHUNK.findall(output)
    if not rows:
        return None
    ppl, _ppl_err, ln_ratio, _ln_err, kld, kld_err, _dp, _dp_err, top1, _top1_err = (float(v) for v in rows[-1])
    return {"mean_kld": kld, "mean_kld_err": kld_err, "same_top1": top1, "ppl": ppl,
            "ppl_base": ppl / math.exp(ln_ratio)}


def _perplexity(bin_dir: Path, args: list[str], log: Path) -> str:
    argv = [str(bin_dir / "llama-perplexity"), *args]
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    log.write_text("$ " + " ".join(argv) + "\n" + proc.stdout + proc.stderr)
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        # The work dir is temporary: the log the user is pointed at must outlive it.
        kept = logs_dir() / f"verify-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}-{log.name}"
        kept.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(log, kept)
        raise EdgekitError(f"llama-perplexity failed (exit {proc.returncode}): {tail[:300]} (log: {kept}).")
    return proc.stdout + proc.stderr


def _common(text_file: Path, ctx: int, threads: int) -> list[str]:
    # Flash attention off and an F32 cache: with it on, llama.cpp's CPU path casts K and V to F16 (llama-graph.cpp),
    # which is not what a float32 reference computes; what is left is the CPU's fp16-table GELU (ggml vec.h).
    return ["-f", str(text_file), "-c", str(ctx), "-b", str(ctx), "-t", str(threads), "-ngl", "0",
            "-fa", "off", "-ctk", "f32", "-ctv", "f32"]


def write_base(bin_dir: Path, reference: Path, workdir: Path, ctx: int = 128, threads: int = 2,
               text: str | None = None) -> Path:
    """llama-perplexity's base file of ``reference``: the tokens of every window and its log-probs."""
    workdir.mkdir(parents=True, exist_ok=True)
    text_file = workdir / "verify.txt"
    text_file.write_text(text or prompt_text())
    base = workdir / "reference.kld"
    _perplexity(bin_dir, ["-m", str(reference), *_common(text_file, ctx, threads), "--kl-divergence-base", str(base)],
                workdir / "reference.log")
    return base


def score(bin_dir: Path, model: Path, base: Path, workdir: Path, reference: str, ctx: int = 128,
          threads: int = 2) -> KldResult:
    """KL divergence and top-1 agreement of ``model`` (GGUF) against the log-probs in ``base``."""
    log = workdir / f"{model.stem}-vs-{base.stem}.log"
    argv = ["-m", str(model), *_common(workdir / "verify.txt", ctx, threads), "--kl-divergence-base", str(base),
            "--kl-divergence"]
    out = _perplexity(bin_dir, argv, log)
    if not _CHUNK.search(out) and not re.search(r"Mean\s+KLD:", out):
        # Its asynchronous logger now and then exits before flushing anything of the report: once more.
        out = _perplexity(bin_dir, argv, log)
    r = parse_kld(out)
    m = re.search(r"computing over (\d+) chunks", out)
    return KldResult(str(model), reference, r["mean_kld"], r.get("mean_kld_err", 0.0), r["same_top1"],
                     r.get("ppl"), r.get("ppl_base"), int(m.group(1)) if m else 0, ctx)


def kl_divergence(bin_dir: Path, reference: Path, model: Path, workdir: Path, ctx: int = 128,
                  threads: int = 2, text: str | None = None) -> KldResult:
    """KL divergence and top-1 agreement of ``model`` against ``reference`` (both GGUF)."""
    base = write_base(bin_dir, reference, workdir, ctx, threads, text)
    return score(bin_dir, model, base, workdir, str(reference), ctx, threads)
