"""Worker run by the Python that has ``litert_lm``: score a continuation, or generate greedily.

Reads JSON on stdin and prints one JSON line:

- ``{"mode": "score", "bundle", "prompt", "continuation", "cache_dir"}`` → ``{"score", "token_scores"}``:
  per-token log-probs, which compare exactly with transformers even for a random model whose byte
  tokens need not form UTF-8;
- ``{"mode": "generate", "bundle", "prompt", "max_tokens", "speculative", "cache_dir"}`` →
  ``{"text", "tokens", "prefill_tokens_per_second", "decode_tokens_per_second", ...}``. With
  ``speculative`` the engine runs the bundle's MTP drafter; its acceptance is logged by LiteRT-LM itself
  (``MTP Drafter - Success rate``, on stderr when the engine closes), which the caller parses.
"""

import json
import sys


def _greedy(litert_lm):  # -> SamplerConfig
    return litert_lm.SamplerConfig(top_k=1, temperature=0.0)


def score(litert_lm, req):  # -> dict
    # LiteRT-LM 0.18.1 prefills <bos> + prompt but its last token, which stays pending; run_text_scoring then
    # runs that token one position early, over the last prefilled token's cache slot, so its scores miss the
    # prompt's second-to-last token (run_decode is not affected). With the last token repeated, that write
    # lands on an identical token at the same position: a no-op, and the scores equal transformers'.
    engine = litert_lm.Engine(req["bundle"], backend=litert_lm.Backend.CPU(), cache_dir=req["cache_dir"])
    session = engine.create_session(apply_prompt_template=False, sampler_config=_greedy(litert_lm))
    prompt = req["prompt"]
    ids = [engine.bos_token_id, *engine.tokenize(prompt)]
    repeated = prompt + engine.detokenize([ids[-1]])  # "<bos>" for an empty prompt
    if [engine.bos_token_id, *engine.tokenize(repeated)] != [*ids, ids[-1]]:
        raise SystemExit(f"Error: cannot repeat the last token of {prompt!r} as text (LiteRT-LM scoring workaround)")
    session.run_prefill([repeated])
    res = session.run_text_scoring([req["continuation"]], store_token_lengths=True)
    return {"score": res.scores[0], "token_scores": list(res.token_scores[0])}


def generate(litert_lm, req):  # -> dict
    litert_lm.set_min_log_severity(litert_lm.LogSeverity.INFO)  # the drafter's success rate is an INFO line
    engine = litert_lm.Engine(req["bundle"], backend=litert_lm.Backend.CPU(), cache_dir=req["cache_dir"],
                              enable_speculative_decoding=bool(req["speculative"]), enable_benchmark=True)
    session = engine.create_session(apply_prompt_template=False, sampler_config=_greedy(litert_lm),
                                    max_output_tokens=int(req["max_tokens"]))
    session.run_prefill([req["prompt"]])
    text = "".join(session.run_decode().texts)
    info = session.get_benchmark_info()
    out = {"text": text, "tokens": engine.tokenize(text) if text else [],
           "prefill_tokens": info.last_prefill_token_count,
           "prefill_tokens_per_second": info.last_prefill_tokens_per_second,
           "decode_tokens": info.last_decode_token_count,
           "decode_tokens_per_second": info.last_decode_tokens_per_second}
    session.close()
    engine.close()  # the drafter logs its success rate here
    return out


def main():  # -> None
    import litert_lm

    req = json.load(sys.stdin)
    out = generate(litert_lm, req) if req.get("mode") == "generate" else score(litert_lm, req)
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
