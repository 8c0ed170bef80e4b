"""What a health check sends: the completion request, and an image and a second of audio.

One spelling for the host's check (:mod:`edgekit.deploy.health`) and the board-side one the fleet runs
(``fleet/scripts.py`` carries this source), so the two cannot drift. The media: a 64×64 RGB gradient PNG and
1 s of a 440 Hz tone as 16 kHz mono 16-bit WAV, sent as OpenAI content parts (``image_url`` with a data URL,
``input_audio`` with format wav) through ``/v1/chat/completions``; the same bytes every time. Standard library
only, no annotations the board's Python 3.6 could not take once stripped.
"""

from __future__ import annotations

import base64
import io
import math
import struct
import wave
import zlib
from typing import Any

MEDIA_PROMPT = {"image": "What is in this picture?", "audio": "What do you hear?"}


def completion_request(prompt: str, n_predict: int, chat: bool) -> tuple[str, dict[str, Any]]:
    """(path, payload) of one greedy llama-server completion; ``chat``: as a user turn, through the model's
    chat template (/v1/chat/completions), else the raw prompt (/completion)."""
    if chat:
        return "/v1/chat/completions", {"messages": [{"role": "user", "content": prompt}], "max_tokens": n_predict,
                                        "temperature": 0.0, "cache_prompt": False, "seed": 0}
    return "/completion", {"prompt": prompt, "n_predict": n_predict, "temperature": 0.0, "cache_prompt": False,
                           "seed": 0}


def openai_request(model: str, prompt: str, n_predict: int, chat: bool) -> tuple[str, dict[str, Any]]:
    """(path, payload) of one greedy vLLM completion: ``chat`` through the model's chat template
    (/v1/chat/completions), else the raw prompt (/v1/completions); always n_predict tokens."""
    common = {"model": model, "max_tokens": n_predict, "temperature": 0.0, "seed": 0, "ignore_eos": True}
    if chat:
        return "/v1/chat/completions", {**common, "messages": [{"role": "user", "content": prompt}]}
    return "/v1/completions", {**common, "prompt": prompt}


def answer_text(data: dict[str, Any], chat: bool, openai: bool = False) -> str:
    """The generated text of a completion body: a chat message, an OpenAI completion, or llama-server's."""
    choice = (data.get("choices") or [{}])[0]
    if chat:
        return str((choice.get("message") or {}).get("content") or "")
    return str((choice.get("text") if openai else data.get("content")) or "")


def media_outcome(kind: str, data: dict[str, Any]) -> dict[str, Any]:
    """One media answer (a /v1/chat/completions body) as the checks report it: TTFT (llama-server's prompt_ms:
    the media encoded and the prompt read), prompt tokens, tokens, tok/s after, drafts."""
    t = data.get("timings") or {}
    tokens = int(t.get("predicted_n") or (data.get("usage") or {}).get("completion_tokens") or 0)
    return {"ok": tokens > 0, "reason": "answered" if tokens > 0 else "the " + kind + " request generated no tokens",
            "ttft_ms": t.get("prompt_ms"), "prompt_tokens": t.get("prompt_n"), "tokens": tokens,
            "tokens_per_second": t.get("predicted_per_second"), "draft_n": t.get("draft_n"),
            "draft_n_accepted": t.get("draft_n_accepted")}


def probe_png(size: int = 64) -> bytes:
    rows = b"".join(b"\x00" + bytes(v for x in range(size) for v in (x * 255 // size, y * 255 // size, 128))
                    for y in range(size))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", size, size, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows, 9)) + chunk(b"IEND", b"")


def probe_wav(seconds: float = 1.0, rate: int = 16000) -> bytes:
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(b"".join(struct.pack("<h", int(8000 * math.sin(2 * math.pi * 440 * i / rate)))
                               for i in range(int(seconds * rate))))
    return buf.getvalue()


def content_part(kind: str) -> dict[str, Any]:
    if kind == "image":
        return {"type": "image_url",
                "image_url": {"url": "data:image/png;base64," + base64.b64encode(probe_png()).decode()}}
    if kind == "audio":
        return {"type": "input_audio", "input_audio": {"data": base64.b64encode(probe_wav()).decode(), "format": "wav"}}
    raise ValueError(f"no probe for {kind!r}")


def chat_payload(kind: str, max_tokens: int) -> dict[str, Any]:
    """A greedy chat request with one ``kind`` part and a short question."""
    parts = [content_part(kind), {"type": "text", "text": MEDIA_PROMPT[kind]}]
    return {"messages": [{"role": "user", "content": parts}], "max_tokens": max_tokens, "temperature": 0.0,
            "seed": 0, "cache_prompt": False}


__all__ = ["MEDIA_PROMPT", "answer_text", "chat_payload", "completion_request", "content_part", "media_outcome",
           "openai_request", "probe_png", "probe_wav"]
