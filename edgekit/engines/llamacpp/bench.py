"""llama.cpp's bench and tune configurations, derived from the release's own llama-server arguments.

The release manifest (``release.json``) carries the exact ``server_args`` the service runs. The
bench serves the same release twice: as deployed (with its drafter / speculative settings) and
with every speculative flag removed (the baseline), each on the bench port, with enough slots
for the highest concurrency. Tune changes only the speculative values.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from edgekit.engines.benchconf import ServerConfig
from edgekit.engines.llamacpp.args import FLAG_SPELLINGS
from edgekit.engines.llamacpp.settings import UNQUANTIZED
from edgekit.engines.llamacpp.settings import of as settings_of

# Flags that take no value (everything else in FLAG_SPELLINGS takes one).
_BOOLEAN = {"no_webui", "metrics"}
SPEC_FLAGS = ("spec_type", "draft_n_max", "draft_n_min", "draft_p_min", "draft_model", "ngld")


def _find(args: list[str], logical: str) -> int | None:
    spellings = FLAG_SPELLINGS[logical]
    for i, a in enumerate(args):
        if a in spellings or any(a.startswith(s + "=") for s in spellings if s.startswith("--")):
            return i
    return None


def get(args: list[str], logical: str) -> str | None:
    i = _find(args, logical)
    if i is None:
        return None
    if "=" in args[i]:
        return args[i].split("=", 1)[1]
    return args[i + 1] if i + 1 < len(args) else None


def drop(args: list[str], logical: str) -> list[str]:
    out = list(args)
    while (i := _find(out, logical)) is not None:
        width = 1 if logical in _BOOLEAN or "=" in out[i] else 2
        del out[i:i + width]
    return out


def put(args: list[str], logical: str, value: Any) -> list[str]:
    """Set a flag's value, keeping the spelling the release uses (else the newest one)."""
    i = _find(args, logical)
    out = list(args)
    if i is None:
        return [*out, FLAG_SPELLINGS[logical][0], str(value)]
    if "=" in out[i]:
        out[i] = f"{out[i].split('=', 1)[0]}={value}"
    else:
        out[i + 1] = str(value)
    return out


def _drop_other_spec(args: list[str]) -> list[str]:
    """Extra `--spec-*` flags (from a recipe's extra_args) go with the speculative settings."""
    out: list[str] = []
    skip = False
    for i, a in enumerate(args):
        if skip:
            skip = False
            continue
        if a.startswith("--spec-"):
            nxt = args[i + 1] if i + 1 < len(args) else None
            skip = "=" not in a and nxt is not None and not nxt.startswith("--")
            continue
        out.append(a)
    return out


def baseline_args(args: list[str]) -> list[str]:
    """The release's arguments without any speculative decoding."""
    for logical in SPEC_FLAGS:
        args = drop(args, logical)
    return _drop_other_spec(args)


def is_speculative(args: list[str]) -> bool:
    spec = get(args, "spec_type")
    return (spec is not None and spec != "none") or get(args, "draft_model") is not None


def for_bench(args: list[str], port: int, parallel: int | None, slot_ctx: int | None) -> list[str]:
    """Move to the bench port; with ``parallel``, that many slots of at least ``slot_ctx`` tokens each."""
    out = put(args, "port", port)
    if parallel is not None:
        out = put(out, "parallel", parallel)
        ctx = int(get(out, "ctx") or 4096)
        if slot_ctx is not None and ctx // parallel < slot_ctx:
            out = put(out, "ctx", slot_ctx * parallel)
    return out


def describe(args: list[str]) -> dict[str, Any]:
    """The settings a reader compares: spec type, draft lengths, slots, context."""
    def num(logical: str) -> float | int | None:
        v = get(args, logical)
        if v is None:
            return None
        try:
            return int(v)
        except ValueError:
            return float(v)

    return {"spec_type": get(args, "spec_type") or "none", "draft_n_max": num("draft_n_max"),
            "draft_p_min": num("draft_p_min"), "parallel": num("parallel"), "ctx_size": num("ctx"),
            "drafter_model": get(args, "draft_model")}


def pair(release_args: list[str], port: int, parallel: int | None, slot_ctx: int | None) -> list[ServerConfig]:
    """[drafter, baseline] from the release (only the baseline when it has no speculative decoding)."""
    base = for_bench(baseline_args(release_args), port, parallel, slot_ctx)
    configs = []
    if is_speculative(release_args):
        spec = for_bench(release_args, port, parallel, slot_ctx)
        configs.append(ServerConfig("drafter", spec, True, describe(spec)))
    configs.append(ServerConfig("baseline", base, False, describe(base)))
    return configs


def configs(manifest: dict[str, Any], port: int, parallel: int | None, slot_ctx: int | None) -> list[ServerConfig]:
    """[drafter, baseline] of a llama.cpp release on the bench port."""
    return pair(list(manifest.get("server_args") or []), port, parallel, slot_ctx)


def tune_point(drafter: ServerConfig, n: int, p_min: float | None) -> ServerConfig:
    """The drafter configuration with ``--spec-draft-n-max n`` (and ``--spec-draft-p-min``; None: the server's)."""
    args = put(list(drafter.args), "draft_n_max", n)
    args = drop(args, "draft_p_min") if p_min is None else put(args, "draft_p_min", p_min)
    if int(get(args, "draft_n_min") or 0) > n:
        args = put(args, "draft_n_min", n)
    settings = {**drafter.settings, **describe(args), "draft_n_max": n, "draft_p_min": p_min}
    return replace(drafter, args=args, settings=settings)  # its key, counters and media kept


def with_kv_cache(cfg: ServerConfig, kind: str) -> ServerConfig:
    """``cfg`` with its KV cache (the drafter's too) at ``kind``; where flash attention is off (an Orin guard), a
    quantized ``kind`` goes to K alone: llama.cpp refuses a quantized V cache without it."""
    args = list(cfg.args)
    k = kind
    v = kind if kind in UNQUANTIZED or get(args, "flash_attn") != "off" else "f16"
    for logical, value in (("cache_type_k", k), ("cache_type_v", v)):
        args = put(args, logical, value)
        if cfg.speculative and get(args, "draft_model") is not None:
            args = put(args, f"{logical}_draft", value)
    settings = {**cfg.settings, "cache_type_k": k, "cache_type_v": v}
    return replace(cfg, args=args, settings=settings)


def llama_bench_argv(release_dir: str, runtime: dict[str, Any], pp: int, tg: int, reps: int) -> list[str]:
    """llama-bench for one test (pp: -p N -n 0, tg: -p 0 -n N) of the release's target, with the settings the
    release serves with."""
    lib = f"{release_dir}/bin:{release_dir}/lib"
    own = settings_of(runtime)
    argv = ["env", f"LD_LIBRARY_PATH={lib}", f"{release_dir}/bin/llama-bench", "-m",
            f"{release_dir}/models/target.gguf", "-p", str(pp), "-n", str(tg), "-r", str(reps), "-o", "jsonl",
            "-ngl", str(own.n_gpu_layers)]
    if own.threads:
        argv += ["-t", str(own.threads)]
    return argv


def llama_bench_records(lines: list[str]) -> list[dict[str, Any]]:
    """llama-bench's jsonl records, each summarized as the results document keeps it."""
    out = []
    for line in lines:
        if line.startswith("{"):
            try:
                out.append(llama_bench_summary(json.loads(line)))
            except ValueError:
                continue
    return out


def llama_bench_summary(rec: dict[str, Any]) -> dict[str, Any]:
    keys = ("n_prompt", "n_gen", "n_depth", "avg_ts", "stddev_ts", "avg_ns", "samples_ts", "n_threads",
            "n_gpu_layers", "model_type", "model_size", "model_n_params", "backends", "build_commit",
            "build_number", "gpu_info", "cpu_info")
    out = {k: rec.get(k) for k in keys}
    out["test"] = "pp" if rec.get("n_gen", 0) == 0 else "tg"
    return out


__all__ = ["ServerConfig", "baseline_args", "configs", "describe", "drop", "for_bench", "get", "is_speculative",
           "llama_bench_argv", "llama_bench_records", "llama_bench_summary", "pair", "put", "tune_point"]
