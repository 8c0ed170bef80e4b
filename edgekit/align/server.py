"""Acceptance as the deployed llama-server reports it: ``timings.draft_n_accepted / draft_n``.

Greedy ``/completion`` requests, one held-out prompt each, summed. llama-server drafts
``--spec-draft-n-max`` tokens per round (``p_min`` 0), so rounds ≈ draft_n / K and the tokens per
verify pass are 1 + K · rate, comparable with the transformers and teacher-forced numbers.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Sequence
from typing import Any

from edgekit.errors import EdgekitError


def complete(url: str, prompt: str, n_predict: int, timeout: float = 120.0) -> dict[str, Any]:
    body = json.dumps({"prompt": prompt, "n_predict": n_predict, "temperature": 0, "cache_prompt": False,
                       "return_tokens": True}).encode()
    req = urllib.request.Request(f"{url.rstrip('/')}/completion", body, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return json.loads(resp.read())
    except OSError as exc:
        raise EdgekitError(f"llama-server at {url} did not answer /completion: {exc}.") from None


def server_acceptance(url: str, prompts: Sequence[str], n_predict: int, k: int) -> dict[str, Any]:
    drafted = accepted = predicted = 0
    predicted_ms = 0.0
    tokens: list[list[int]] = []
    for prompt in prompts:
        answer = complete(url, prompt, n_predict)
        t = answer.get("timings", {})
        drafted += int(t.get("draft_n", 0))
        accepted += int(t.get("draft_n_accepted", 0))
        predicted += int(t.get("predicted_n", 0))
        predicted_ms += float(t.get("predicted_ms", 0.0))
        tokens.append(list(answer.get("tokens") or []))
    rate = accepted / drafted if drafted else 0.0
    return {"prompts": len(prompts), "draft_n": drafted, "draft_n_accepted": accepted,
            "acceptance_rate": round(rate, 4), "tokens_per_verify": round(1 + k * rate, 4),
            "predicted_n": predicted, "tokens_per_second": round(1000 * predicted / predicted_ms, 2)
            if predicted_ms else None, "tokens": tokens}


__all__ = ["complete", "server_acceptance"]
