"""What a health check sends, spelled once in the board-side check (edgekit/agent/health.py) and
imported from there by the host's code."""

from __future__ import annotations

from edgekit.agent.health import (
    MEDIA_PROMPT,
    answer_text,
    chat_payload,
    completion_request,
    content_part,
    media_outcome,
    openai_request,
    probe_png,
    probe_wav,
)

__all__ = ["MEDIA_PROMPT", "answer_text", "chat_payload", "completion_request", "content_part", "media_outcome",
           "openai_request", "probe_png", "probe_wav"]
