"""What a client of a board's release sees through the OpenAI Python client (`openai`), the way most
people talk to these servers: a conversation answered, the same answer streamed, the key as ``api_key``."""

from __future__ import annotations

import openai

# A conversation of every role, so a template that drops or garbles a turn shows (as ChatML did for Gemma).
MESSAGES = [
    {"role": "system", "content": "Answer in a few words."},
    {"role": "user", "content": "Name a colour."},
    {"role": "assistant", "content": "Blue."},
    {"role": "user", "content": "The capital of France is"},
]
CHATML = ("<|im_start|>", "<|im_end|>")


def client(port: int, api_key: str = "none", host: str = "127.0.0.1") -> openai.OpenAI:
    return openai.OpenAI(base_url=f"http://{host}:{port}/v1", api_key=api_key, max_retries=0, timeout=300)


def ask(port: int, model: str, api_key: str = "none", host: str = "127.0.0.1") -> tuple[str, str]:
    """The reply to :data:`MESSAGES`, greedy, asked once whole and once streamed: (text, streamed text)."""
    c = client(port, api_key, host)
    reply = c.chat.completions.create(model=model, messages=MESSAGES, max_tokens=16, temperature=0)
    assert reply.choices[0].message.role == "assistant" and reply.usage and reply.usage.completion_tokens > 0
    text = reply.choices[0].message.content or ""
    stream = c.chat.completions.create(model=model, messages=MESSAGES, max_tokens=16, temperature=0, stream=True)
    streamed = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    return text, streamed


def assert_answers(port: int, model: str, api_key: str = "none", host: str = "127.0.0.1",
                   words: bool = False) -> str:
    """The release answers the OpenAI client: the same text streamed as whole (greedy), nothing of ChatML, and
    with ``words`` (a real model) some letters; returns the text. (A tiny generated model's turn may be short.)"""
    text, streamed = ask(port, model, api_key, host)
    assert not any(m in text for m in CHATML), text
    assert streamed == text, (streamed, text)
    assert not words or sum(c.isalpha() for c in text) >= 3, text
    return text
