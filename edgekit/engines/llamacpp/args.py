"""llama-server's command line from a recipe, with flag names checked against the binary's --help.

llama.cpp renamed the speculative-decoding flags in 2026 (`--draft-max` → `--spec-draft-n-max`,
`-md` kept as an alias of `--spec-draft-model`). The deployed binary's help text decides which
spelling is used, so a release never carries a flag its binary does not know.
"""

from __future__ import annotations

import functools
import re

from edgekit.config.recipes import Runtime
from edgekit.engines.llamacpp.settings import of as settings_of
from edgekit.errors import EdgekitError
from edgekit.release.chat_template import RELEASE_FILE as CHAT_TEMPLATE_FILE

# logical name → accepted spellings, newest first
FLAG_SPELLINGS: dict[str, tuple[str, ...]] = {
    "model": ("-m", "--model"),
    "draft_model": ("-md", "--spec-draft-model", "--model-draft"),
    "spec_type": ("--spec-type",),
    "draft_n_max": ("--spec-draft-n-max", "--draft-max", "--draft-n"),
    "draft_n_min": ("--spec-draft-n-min", "--draft-min"),
    "draft_p_min": ("--spec-draft-p-min", "--draft-p-min"),
    "ngl": ("-ngl", "--n-gpu-layers", "--gpu-layers"),
    "ngld": ("-ngld", "--spec-draft-ngl", "--n-gpu-layers-draft", "--gpu-layers-draft"),
    "ctx": ("-c", "--ctx-size"),
    "parallel": ("-np", "--parallel"),
    "threads": ("-t", "--threads"),
    "host": ("--host",),
    "port": ("--port",),
    "no_webui": ("--no-webui",),
    "metrics": ("--metrics",),
    "no_slots": ("--no-slots",),
    "api_key_file": ("--api-key-file",),
    "flash_attn": ("-fa", "--flash-attn"),
    "cache_type_k": ("-ctk", "--cache-type-k"),
    "cache_type_v": ("-ctv", "--cache-type-v"),
    "cache_type_k_draft": ("-ctkd", "--spec-draft-type-k", "--cache-type-k-draft"),
    "cache_type_v_draft": ("-ctvd", "--spec-draft-type-v", "--cache-type-v-draft"),
    "mmproj": ("-mm", "--mmproj"),
    "jinja": ("--jinja",),
    "chat_template_file": ("--chat-template-file",),
}

_FLAG = re.compile(r"(?<![\w-])(--?[A-Za-z][\w-]*)")


@functools.lru_cache(maxsize=8)
def _flags_of(help_text: str) -> frozenset[str]:
    return frozenset(_FLAG.findall(help_text))


def known_flags(help_text: str) -> set[str]:
    # The same --help text is read for every unit of every board of a fleet plan: scanned once.
    return set(_flags_of(help_text))


def _flag(logical: str, flags: set[str], required: bool = True) -> str | None:
    for spelling in FLAG_SPELLINGS[logical]:
        if spelling in flags:
            return spelling
    if required:
        raise EdgekitError(
            f"The deployed llama-server knows none of {', '.join(FLAG_SPELLINGS[logical])}; "
            "its llama.cpp is too old or too new for this edgekit."
        )
    return None


def spec_types(help_text: str) -> set[str]:
    m = re.search(r"--spec-type\s+\[?([\w|,-]+)", help_text)
    return set(re.split(r"[|,]", m.group(1))) if m else set()


def server_args(
    runtime: Runtime,
    help_text: str,
    target: str,
    drafter: str | None,
    port: int,
    mmproj: str | None = None,
    key_file: str | None = None,
) -> list[str]:
    """The argument list (without the binary) for llama-server serving ``target`` (+ ``drafter``, + the
    vision/audio projector ``mmproj``; with ``key_file``, every endpoint but /health and /models needs its key)."""
    flags = known_flags(help_text)
    f = lambda name, req=True: _flag(name, flags, req)  # noqa: E731 - local shorthand
    own = settings_of(runtime)
    args = [f("model"), target, f("ctx"), str(runtime.ctx_size), f("ngl"), str(own.n_gpu_layers),
            f("parallel"), str(runtime.parallel), f("host"), runtime.host, f("port"), str(port)]
    if own.threads:
        args += [f("threads"), str(own.threads)]
    if runtime.spec_type != "none":
        known = spec_types(help_text)
        if known and runtime.spec_type not in known:
            raise EdgekitError(
                f"The deployed llama-server does not know --spec-type {runtime.spec_type} "
                f"(it knows {', '.join(sorted(known))})."
            )
        args += [f("spec_type"), runtime.spec_type, f("draft_n_max"), str(runtime.draft_n_max)]
        if runtime.draft_n_min:
            args += [f("draft_n_min"), str(runtime.draft_n_min)]
        if runtime.draft_p_min is not None:
            args += [f("draft_p_min"), str(runtime.draft_p_min)]
    if drafter is not None:
        args += [f("draft_model"), drafter, f("ngld"), str(own.n_gpu_layers_draft)]
    if mmproj is not None:
        args += [f("mmproj"), mmproj]
    if own.flash_attn != "auto":
        args += [f("flash_attn"), own.flash_attn]
    for kind in ("k", "v"):  # f16, llama-server's default, passes no flag (a release made before stays the same)
        cache_type = getattr(own, f"cache_type_{kind}")
        if cache_type != "f16":
            args += [f(f"cache_type_{kind}"), cache_type]
            args += [f(f"cache_type_{kind}_draft"), cache_type] if drafter is not None else []
    if (no_webui := f("no_webui", False)) is not None:
        args.append(no_webui)  # a board serves an API, not a chat page
    if (metrics := f("metrics", False)) is not None:
        args.append(metrics)
    if not own.slots and (no_slots := f("no_slots", False)) is not None:
        args.append(no_slots)  # /slots shows every slot's prompt: other users' words
    if runtime.chat_template is not None:  # the release's file; --jinja said, as older refs default to off
        args += [f("jinja"), f("chat_template_file"), CHAT_TEMPLATE_FILE]
    if key_file is not None:
        args += [f("api_key_file"), key_file]  # a path: the key itself never shows in `ps`
    return [a for a in args if a is not None] + list(runtime.extra_args)
