"""The registry of serving engines, as data: name → "module:Class", imported only when that engine is used
(the shape of vLLM's model registry). A recipe's `runtime.engine` must be one of these names; adding an
engine is one module under edgekit/engines/ and one row here."""

from __future__ import annotations

ENGINE_CLASSES: dict[str, str] = {
    "llama.cpp": "edgekit.engines.llamacpp:LlamaCpp",  # the default: llama-server, GGUF, --spec-type draft-mtp
    "vllm": "edgekit.engines.vllm:Vllm",  # vLLM's OpenAI server, HF safetensors, speculative_config "mtp"
    "litert-lm": "edgekit.engines.litert:Litert",  # a .litertlm bundle behind the agent's front
}


def engine_names() -> tuple[str, ...]:
    return tuple(ENGINE_CLASSES)
