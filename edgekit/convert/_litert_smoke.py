"""Worker run by the Python that has ``litert_lm``: prefill a prompt, score a continuation.

Reads JSON ``{"bundle", "prompt", "continuation", "cache_dir"}`` on stdin; prints one JSON line
``{"score": total log-prob, "token_scores": [...]}``. Scores instead of generated text: a random
tiny model emits byte tokens that need not form UTF-8, which LiteRT-LM's detokenizer renders in
its own way, while per-token log-probs compare exactly with transformers.
"""

import json
import sys


def main() -> None:
    import litert_lm

    req = json.load(sys.stdin)
    engine = litert_lm.Engine(req["bundle"], backend=litert_lm.Backend.CPU(), cache_dir=req["cache_dir"])
    session = engine.create_session(apply_prompt_template=False,
                                    sampler_config=litert_lm.SamplerConfig(top_k=1, temperature=0.0))
    session.run_prefill([req["prompt"]])
    res = session.run_text_scoring([req["continuation"]], store_token_lengths=True)
    print(json.dumps({"score": res.scores[0], "token_scores": list(res.token_scores[0])}))


if __name__ == "__main__":
    main()
