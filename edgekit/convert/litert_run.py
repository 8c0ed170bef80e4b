"""Run a ``.litertlm`` bundle with LiteRT-LM (CPU backend) in the Python that has ``litert_lm``.

Scoring (per-token log-probs of a continuation) compares a bundle with transformers exactly;
greedy generation, with or without the bundle's MTP drafter, gives text, token ids, LiteRT-LM's own
prefill/decode rates and — with the drafter — its acceptance (``MTP Drafter - Success rate``, the
share of drafted tokens the target verified, which LiteRT-LM logs when the engine closes).
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from edgekit.convert.litert import litert_python
from edgekit.errors import EdgekitError

_WORKER = Path(__file__).with_name("_litert_worker.py")
_SUCCESS = re.compile(r"MTP Drafter - Success rate:\s*([0-9.eE+-]+|nan)")


@dataclass(frozen=True)
class Generation:
    text: str
    tokens: list[int]
    speculative: bool
    prefill_tokens: int
    prefill_tokens_per_second: float
    decode_tokens: int
    decode_tokens_per_second: float
    acceptance: float | None  # drafted tokens the target accepted (speculative runs only)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _run(req: dict[str, Any], workdir: Path, python: str | None) -> tuple[dict[str, Any], str]:
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "home").mkdir(exist_ok=True)
    (workdir / "cache").mkdir(exist_ok=True)
    # The runtime writes under ~/.litert-lm: keep that out of the user's home.
    env = {**os.environ, "HOME": str(workdir / "home")}
    proc = subprocess.run([python or litert_python(), str(_WORKER)], input=json.dumps(
        {**req, "cache_dir": str(workdir / "cache")}), capture_output=True, text=True, env=env, check=False)
    if proc.returncode != 0:
        errors = [ln for ln in proc.stderr.splitlines() if "rror" in ln] or proc.stderr.strip().splitlines() or [""]
        raise EdgekitError(f"LiteRT-LM could not run {Path(req['bundle']).name}: {errors[-1][:300]}")
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


def score_text(bundle: Path, prompt: str, continuation: str, workdir: Path,
               python: str | None = None) -> list[float]:
    """LiteRT-LM's log-prob of each token of ``continuation`` after ``prompt`` (CPU backend)."""
    out, _ = _run({"mode": "score", "bundle": str(bundle), "prompt": prompt, "continuation": continuation},
                  workdir, python)
    return [float(x) for x in out["token_scores"]]


def generate(bundle: Path, prompt: str, max_tokens: int, workdir: Path, speculative: bool = False,
             python: str | None = None) -> Generation:
    """Greedy continuation of ``prompt`` (no chat template), ``max_tokens`` at most."""
    out, stderr = _run({"mode": "generate", "bundle": str(bundle), "prompt": prompt, "max_tokens": max_tokens,
                        "speculative": speculative}, workdir, python)
    rates = _SUCCESS.findall(stderr)
    if speculative and not rates:
        raise EdgekitError(f"LiteRT-LM ran {Path(bundle).name} without its MTP drafter (no drafter statistics).")
    acceptance = float(rates[-1]) if rates else None
    if acceptance is not None and math.isnan(acceptance):  # nothing drafted (0 / 0)
        acceptance = None
    return Generation(out["text"], [int(t) for t in out["tokens"]], speculative, int(out["prefill_tokens"]),
                      float(out["prefill_tokens_per_second"]), int(out["decode_tokens"]),
                      float(out["decode_tokens_per_second"]), acceptance)


__all__ = ["Generation", "generate", "score_text"]
