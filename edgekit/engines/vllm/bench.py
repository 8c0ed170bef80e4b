"""vLLM's bench and tune configurations (engine: vllm): the same bench, vLLM's server and dialect.

The deployed release's own server arguments (``release.json``), moved to the bench port, with
enough sequences for the highest concurrency and a context for the longest prompt: with its MTP
drafter (``--speculative-config``) and without it (the baseline). The agent's load speaks vLLM's
OpenAI API (``--api openai``) and reads the drafts of each run from ``/metrics``. llama-bench and
the GGUF roofline are llama.cpp's, so they are left out.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from edgekit.engines.benchconf import ServerConfig
from edgekit.engines.vllm.container import ENVIRONMENT
from edgekit.errors import EdgekitError

__all__ = ["configs", "set_flag", "tune_point"]
SPEC = "--speculative-config"


def set_flag(args: list[str], flag: str, value: str) -> list[str]:
    out = list(args)
    if flag in out:
        out[out.index(flag) + 1] = value
    else:
        out += [flag, value]
    return out


def _value(args: list[str], flag: str) -> str | None:
    return args[args.index(flag) + 1] if flag in args and args.index(flag) + 1 < len(args) else None


def configs(manifest: dict[str, Any], release_dir: str, python: str, port: int, parallel: int | None,
            slot_ctx: int | None) -> list[ServerConfig]:
    """[drafter, baseline] (only the baseline when the release does not draft)."""
    args = [a.replace("$RELEASE", release_dir) for a in manifest.get("server_args") or []]
    exe = [python]
    if manifest.get("server_command") == ["docker"]:  # the release's container, under the bench's own name
        exe, args = ["docker"], set_flag(args, "--name", "edgekit-vllm-bench")
    args = set_flag(args, "--port", str(port))
    if parallel is not None:
        args = set_flag(args, "--max-num-seqs", str(parallel))
    if slot_ctx is not None and int(_value(args, "--max-model-len") or 0) < slot_ctx:
        args = set_flag(args, "--max-model-len", str(slot_ctx))
    base = list(args)
    if SPEC in base:
        i = base.index(SPEC)
        del base[i:i + 2]
    model = str(manifest.get("recipe") or "")
    rt = manifest.get("runtime") or {}

    def settings(spec: bool) -> dict[str, Any]:
        return {"backend": "vllm", "engine": "vllm", "vllm": manifest.get("vllm"),
                "spec_type": "mtp" if spec else "none", "draft_n_max": rt.get("draft_n_max") if spec else None,
                "parallel": int(_value(args, "--max-num-seqs") or 1),
                "ctx_size": int(_value(args, "--max-model-len") or 0)}

    out = []
    if SPEC in args:
        out.append(ServerConfig("drafter", args, True, settings(True), exe, ENVIRONMENT, "openai", model))
    out.append(ServerConfig("baseline", base, False, settings(False), exe, ENVIRONMENT, "openai", model))
    return out


def tune_point(drafter: ServerConfig, n: int, p_min: float | None) -> ServerConfig:
    """The drafter configuration with ``num_speculative_tokens`` n (vLLM's MTP drafter has no p-min)."""
    if p_min is not None:
        raise EdgekitError("vLLM's MTP drafter has no p-min: tune it with --draft-n (num_speculative_tokens) "
                           "and --p-min default.")
    args = list(drafter.args)
    i = args.index(SPEC)
    args[i + 1] = json.dumps({**json.loads(args[i + 1]), "num_speculative_tokens": n}, separators=(",", ":"))
    settings = {**drafter.settings, "draft_n_max": n, "draft_p_min": p_min}
    return replace(drafter, args=args, settings=settings)  # its key, counters and media kept
