"""The chat template a release serves when its model's own files carry none (a base checkpoint).

A recipe names one of the templates edgekit ships (``runtime.chat_template``); the release carries it as
one file that every engine reads: llama-server (``--jinja --chat-template-file``), vLLM
(``--chat-template``) and the LiteRT-LM front. Clients then get the model's own turns through
``/v1/chat/completions`` instead of a format the model never saw (llama-server falls back to ChatML).
"""

from __future__ import annotations

from pathlib import Path

from edgekit.resources import chat_templates_dir

RELEASE_FILE = "models/chat_template.jinja"


def template_files(name: str | None) -> dict[str, Path]:
    """The release file for ``name`` (none when the model's own template serves)."""
    return {RELEASE_FILE: chat_templates_dir() / f"{name}.jinja"} if name else {}


def served_path(rdir: str, name: str | None) -> str | None:
    """Where a server in release ``rdir`` reads the template; None when the model's own serves."""
    return f"{rdir}/{RELEASE_FILE}" if name else None
