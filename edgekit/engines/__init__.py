"""Serving engines, one module each, behind one seam (`base.Engine`) that deploy, health, status and
rollback share: what a release ships, the server's argv, how health and acceptance are read.

    llamacpp.py   llama-server (GGUF; --spec-type draft-mtp), the default
    vllm.py       vLLM's OpenAI server (HF safetensors; speculative_config method "mtp")
    litert.py     LiteRT-LM (a .litertlm bundle with edgekit's MTP drafter section) behind the agent's front
"""

from __future__ import annotations

from edgekit.engines.base import Engine, EngineRelease, ReleaseContext
from edgekit.errors import EdgekitError

ENGINES = ("llama.cpp", "vllm", "litert-lm")


def get_engine(name: str) -> Engine:
    if name == "llama.cpp":
        from edgekit.engines.llamacpp import LlamaCpp

        return LlamaCpp()
    if name == "vllm":
        from edgekit.engines.vllm import Vllm

        return Vllm()
    if name == "litert-lm":
        from edgekit.engines.litert import Litert

        return Litert()
    raise EdgekitError(f"Unknown engine {name!r}; edgekit serves with {', '.join(ENGINES)}.")


__all__ = ["ENGINES", "Engine", "EngineRelease", "ReleaseContext", "get_engine"]
