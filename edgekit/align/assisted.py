"""Acceptance as transformers' assisted generation measures it (``generate(assistant_model=drafter)``).

transformers drives a Gemma 4 assistant with ``SinglePositionMultiTokenCandidateGenerator``; each round
drafts up to ``num_assistant_tokens`` tokens and the target keeps ``n_matches`` of them. The counts are
read off the candidate generator ``generate`` builds (its two calls per round), nothing is re-implemented.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from edgekit.align.objective import summarize


@contextmanager
def _recording(target: Any, rounds: list[tuple[int, int]]) -> Iterator[None]:
    """Record (drafted, accepted) per round of every assisted ``generate`` on ``target``."""
    original = target._get_candidate_generator

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        gen = original(*args, **kwargs)
        get_candidates, update = gen.get_candidates, gen.update_candidate_strategy
        pending: dict[str, int] = {}

        def recording_get(input_ids: Any, *a: Any, **kw: Any) -> Any:
            out, logits = get_candidates(input_ids, *a, **kw)
            pending["drafted"] = out.shape[1] - input_ids.shape[1]
            return out, logits

        def recording_update(input_ids: Any, scores: Any, n_matches: Any) -> Any:
            drafted = pending.pop("drafted", 0)
            if drafted:  # the first call drafts nothing: the target has not run yet
                rounds.append((drafted, int(n_matches)))
            return update(input_ids, scores, n_matches)

        gen.get_candidates, gen.update_candidate_strategy = recording_get, recording_update
        return gen

    target._get_candidate_generator = wrapped
    try:
        yield
    finally:
        del target._get_candidate_generator  # back to the class's method


def assisted_acceptance(pair: Any, drafter: Any, prompts: Sequence[str], new_tokens: int, k: int) -> dict[str, Any]:
    """Greedy assisted generation of each prompt; per-position acceptance and whether the output equals
    the target's own greedy output (it must: verification keeps the target's tokens)."""
    import torch

    drafter.eval()
    drafter.generation_config.num_assistant_tokens = k
    drafter.generation_config.num_assistant_tokens_schedule = "constant"
    rounds: list[tuple[int, int]] = []
    identical = 0
    with torch.no_grad(), _recording(pair.target, rounds):
        for prompt in prompts:
            enc = pair.tokenizer(prompt, return_tensors="pt").to(pair.device)
            kwargs = {"max_new_tokens": new_tokens, "do_sample": False, "pad_token_id": pair.tokenizer.pad_token_id}
            with_drafter = pair.target.generate(**enc, assistant_model=drafter, **kwargs)
            alone = pair.target.generate(**enc, **kwargs)
            identical += int(torch.equal(with_drafter, alone))
    drafted = [sum(1 for d, _ in rounds if d >= j) for j in range(1, k + 1)]
    accepted = [sum(1 for _, m in rounds if m >= j) for j in range(1, k + 1)]
    out = summarize(k, len(rounds), [a / d if d else 0.0 for a, d in zip(accepted, drafted, strict=True)])
    total_drafted = sum(d for d, _ in rounds)
    out.update(draft_n=total_drafted, draft_n_accepted=sum(m for _, m in rounds),
               measured_rate=round(sum(m for _, m in rounds) / total_drafted, 4) if total_drafted else 0.0,
               prompts=len(prompts), identical_to_target=identical)
    return out


__all__ = ["assisted_acceptance"]
