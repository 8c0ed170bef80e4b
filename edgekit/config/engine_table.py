"""The registry of serving engines, as data: name → "module:Class", imported only when that engine is used
(the shape of vLLM's model registry). A recipe's `runtime.engine` must be one of these names; adding an
engine is one module under edgekit/engines/ and one row here.

An engine of the user's own (or a test's) is registered without editing edgekit, with one line in the
environment: ``EDGEKIT_ENGINES="name=package.module:Class"`` (several separated by commas); its module must
be importable (installed, or on PYTHONPATH) and its class is built on ``edgekit.engines.EngineBase``.
"""

from __future__ import annotations

import os
import re

from edgekit.errors import EdgekitError

ENGINE_CLASSES: dict[str, str] = {
    "llama.cpp": "edgekit.engines.llamacpp.engine:LlamaCpp",  # the default: llama-server, GGUF, --spec-type draft-mtp
    "vllm": "edgekit.engines.vllm.engine:Vllm",  # vLLM's OpenAI server, HF safetensors, speculative_config "mtp"
    "litert-lm": "edgekit.engines.litert.engine:Litert",  # a .litertlm bundle behind the agent's front
}

ENV = "EDGEKIT_ENGINES"
_NAME = re.compile(r"^[a-z][a-z0-9._-]{0,31}$")
_TARGET = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$")


def engine_classes() -> dict[str, str]:
    """The built-in engines, then those ``$EDGEKIT_ENGINES`` registers (which may not replace a built-in)."""
    out = dict(ENGINE_CLASSES)
    for item in filter(None, (part.strip() for part in os.environ.get(ENV, "").split(","))):
        name, sep, target = (s.strip() for s in item.partition("="))
        if not sep or not _NAME.match(name) or not _TARGET.match(target):
            raise EdgekitError(f"${ENV} entry {item!r} is not name=package.module:Class (a lower-case name).")
        if name in ENGINE_CLASSES:
            raise EdgekitError(f"${ENV} cannot replace the built-in engine {name!r}; give yours another name.")
        out[name] = target
    return out


def engine_names() -> tuple[str, ...]:
    return tuple(engine_classes())
