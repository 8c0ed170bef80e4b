"""The two workloads and what one run of each yields.

* ``load``: the agent's streaming load against the bench server (see edgekit/agent/load.py);
  a run is one (configuration, concurrency, context length, repetition).
* the engine's own benchmark of the target alone (llama.cpp's ``bin/llama-bench``, see
  ``engines/llamacpp/bench.py``), prompt processing and generation separately, each a job whose window
  the agent marks on the board's monotonic clock (agent/jobs.py).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from edgekit.bench.stats import percentile


@dataclass(frozen=True)
class Point:
    concurrency: int
    context_length: int | None
    temperature: float = 0.0  # the load's sampling temperature: 0 is greedy

    def label(self) -> str:
        return f"c={self.concurrency} ctx={self.context_length or '-'}" + temperature_label(self.temperature)


def temperature_label(temperature: float | None) -> str:
    """`` T=0.7`` for a sampled point, nothing for a greedy one (the labels greedy benches always had)."""
    return f" T={temperature:g}" if temperature else ""


def requests_per_run(concurrency: int, categories: int, rounds: int = 1) -> int:
    """Enough requests that every category is asked, in whole rounds of ``concurrency``."""
    need = max(concurrency, categories) * rounds
    return math.ceil(need / concurrency) * concurrency


def load_argv(python: str, agent: str, port: int, prompts: str, point: Point, requests: int, n_gen: int,
              warmup: int, offset: int, ignore_eos: bool, out: str, label: str, api: str = "llama",
              model: str = "", raw: bool = False, key_file: str = "", draft_counters: Sequence[str] = ()
              ) -> list[str]:
    argv = [python, agent, "load", "--port", str(port), "--prompts", prompts, "--concurrency",
            str(point.concurrency), "--requests", str(requests), "--n-gen", str(n_gen), "--warmup", str(warmup),
            "--offset", str(offset), "--out", out, "--label", label]
    if api != "llama":
        argv += ["--api", api, "--model", model]
    if draft_counters:
        argv += ["--draft-counters", ",".join(draft_counters)]
    if point.context_length:
        argv += ["--context-length", str(point.context_length)]
    if point.temperature:
        argv += ["--temperature", f"{point.temperature:g}"]
    if ignore_eos:
        argv.append("--ignore-eos")
    if raw:
        argv.append("--raw")
    if key_file:
        argv += ["--api-key-file", key_file]
    return argv


def _sum(recs: Sequence[dict[str, Any]], key: str) -> int:
    return sum(int(r.get(key) or 0) for r in recs)


def acceptance(recs: Sequence[dict[str, Any]]) -> tuple[float | None, dict[str, dict[str, Any]]]:
    """Pooled acceptance (accepted / drafted) overall and per prompt category."""
    ok = [r for r in recs if "error" not in r]
    drafted = _sum(ok, "draft_n")
    overall = _sum(ok, "draft_n_accepted") / drafted if drafted else None
    by_cat: dict[str, dict[str, Any]] = {}
    for cat in sorted({r["category"] for r in ok}):
        rs = [r for r in ok if r["category"] == cat]
        n, a = _sum(rs, "draft_n"), _sum(rs, "draft_n_accepted")
        by_cat[cat] = {"draft_n": n, "draft_n_accepted": a, "acceptance": a / n if n else None}
    return overall, by_cat


def load_metrics(out: dict[str, Any]) -> dict[str, Any]:
    """Per-run figures from the agent's load output."""
    recs = out.get("requests") or []
    ok = [r for r in recs if "error" not in r]
    win = out.get("window") or {}
    dur = float(win.get("duration_s") or 0.0)
    tokens = _sum(ok, "tokens")
    acc, by_cat = acceptance(recs)
    tps = [r["decode_tps"] for r in ok if r.get("decode_tps")]
    ttft = [r["ttft_s"] for r in ok if r.get("ttft_s") is not None]
    lat = [r["latency_s"] for r in ok]

    def pct(vals: list[float], q: float) -> float | None:
        v = percentile(vals, q)
        return round(v, 6) if v is not None else None

    drafted, accepted = _sum(ok, "draft_n"), _sum(ok, "draft_n_accepted")
    if out.get("spec_decode"):  # vLLM: the run's drafts from the server's counters, not per request
        drafted, accepted = int(out["spec_decode"]["draft_n"]), int(out["spec_decode"]["draft_n_accepted"])
        acc = accepted / drafted if drafted else None
    return {
        "requests": len(recs), "errors": len(recs) - len(ok), "tokens": tokens,
        "prompt_tokens_mean": round(sum(r.get("prompt_tokens", 0) for r in ok) / len(ok), 1) if ok else None,
        "duration_s": round(dur, 6), "tokens_per_second": round(tokens / dur, 4) if dur > 0 else None,
        "decode_tokens_per_second_mean": round(sum(tps) / len(tps), 4) if tps else None,
        "ttft_p50_s": pct(ttft, 50), "ttft_p95_s": pct(ttft, 95),
        "latency_p50_s": pct(lat, 50), "latency_p95_s": pct(lat, 95),
        "draft_n": drafted, "draft_n_accepted": accepted,
        "acceptance": round(acc, 6) if acc is not None else None, "acceptance_by_category": by_cat,
    }
