"""Worker run by the Python that has ``litert_torch``: a ``.litertlm`` with a Gemma 4 target *and* its MTP drafter.

Reads JSON ``{"target", "drafter", "out_dir", "prefill_lengths", "cache_length", "quant", "draft_steps"}``
on stdin; writes ``out_dir/model.litertlm`` and prints one JSON line describing it.

LiteRT-LM 0.18.1 runs speculative decoding (CPU/GPU executor, ``LlmLiteRtMtpDrafter``) when the bundle
has a ``tf_lite_mtp_drafter`` section. Its contract, read from LiteRT-LM's sources and checked here:

- target ``decode`` and ``verify`` signatures also output ``activations`` (the final hidden state after
  the last norm, float32); ``verify`` takes ``embeddings`` ``[1, G+1, H]`` and ``input_pos`` ``[G+1]``
  (G, the draft length, is fixed at export). litert-torch 0.10 adds ``verify`` when ``assistant_model``
  is set, but its Gemma 4 module returns no ``activations`` and traces the verify mask as bool where the
  graph adds it to the scores: both are patched below, around the export only.
- the drafter's signature 0 (``mtp_drafter``): inputs ``activations`` ``[1, 1, 2H]`` (target embedding of
  the last token ++ the previous hidden state), ``input_pos`` ``[1]`` (= the last position in the KV
  cache) and every ``kv_cache_*`` tensor it reads, bound by name to the target's own buffers; outputs
  ``logits`` ``[1, 1, V]`` and ``projected_activations`` ``[1, 1, H]``.

The drafter graph computes what transformers' ``Gemma4AssistantForCausalLM`` computes in a drafting
round: query at position t + 1 (LiteRT-LM passes t), keys 0…t of the last non-shared target layer of
each attention type, llama.cpp's sliding window ((t + 1) − p < W, as edgekit's alignment trains), and the
drafter's own head: dense logits over the vocabulary, or, for an assistant with ordered embeddings (every
published E2B/E4B one), transformers' centroid-masked head (:func:`_ordered_head`).
"""

import json
import os
import shutil
import sys
import tempfile


def _patch_target_export():  # -> None
    """Make litert-torch's Gemma 4 decode/verify signatures meet LiteRT-LM's MTP verifier contract."""
    import torch
    from litert_torch.generative.export_hf.core import exportable_module as core
    from litert_torch.generative.export_hf.model_ext.gemma4 import exportable_module as g4

    cls = g4.LiteRTExportableModuleForDecoderOnlyLMGenerateExternalEmbedder
    forward = cls.forward

    def forward_with_activations(self, *args, **kwargs):
        seen = {}
        hook = self.model.model.language_model.register_forward_hook(
            lambda _m, _a, out: seen.__setitem__("h", out.last_hidden_state))
        try:
            out = forward(self, *args, **kwargs)
        finally:
            hook.remove()
        if self.export_verifier:
            out["activations"] = seen["h"].to(torch.float32)
        return out

    cls.forward = forward_with_activations

    sample_inputs = core.LiteRTExportableModuleForDecoderOnlyLMGenerate.get_sample_inputs

    def sample_inputs_float_verify_mask(self, model_config):
        graphs = sample_inputs(self, model_config)
        if "verify" in graphs and not self.export_config.extra_kwargs.get("use_bool_mask", False):
            inputs, shapes = graphs["verify"]
            inputs = dict(inputs, mask=inputs["mask"].to(torch.float32))  # additive, like decode's
            graphs["verify"] = (inputs, shapes)
        return graphs

    core.LiteRTExportableModuleForDecoderOnlyLMGenerate.get_sample_inputs = sample_inputs_float_verify_mask


def _export_target(req, work):  # -> str
    from litert_torch.generative.export_hf.export import export

    _patch_target_export()
    kwargs = dict(prefill_lengths=req["prefill_lengths"], cache_length=req["cache_length"],
                  externalize_embedder=True, export_vision_encoder=False, export_audio_encoder=False,
                  assistant_model="edgekit-mtp", mtp_verifier_step=req["draft_steps"] + 1,
                  quantization_recipe=req.get("quantization_recipe") or "none")  # None: litert-torch's int8
    if req.get("tokenizer_path_override"):
        kwargs["tokenizer_path_override"] = req["tokenizer_path_override"]
    export(req["target"], work, **kwargs)
    return os.path.join(work, "model.litertlm")


def _kv_layout(bundle_dir):  # -> dict[str, tuple[list[int], str]]
    """The target's KV tensors as its ``decode`` signature declares them: name -> (shape, dtype)."""
    from ai_edge_litert.interpreter import Interpreter

    path = next(os.path.join(bundle_dir, f) for f in sorted(os.listdir(bundle_dir))
                if f.endswith("tf_lite_prefill_decode.tflite"))
    runner = Interpreter(model_path=path).get_signature_runner("decode")
    return {name: (list(d["shape"]), d["dtype"].__name__) for name, d in runner.get_input_details().items()
            if name.startswith("kv_cache_")}


def _grouped_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **_kwargs):
    """Eager attention that groups query heads instead of repeating K/V (transformers' ``repeat_kv``).

    litert-torch 0.10 miscompiles expand → reshape → transpose (``repeat_kv`` then ``k.transpose(2, 3)``):
    the converted graph reads K as if it were stored transposed (measured: logits off by up to 5 on the
    tiny drafter, 2e-6 once K is read transposed). Grouping the queries needs neither op.
    """
    import torch

    b, heads, q_len, dim = query.shape
    groups = key.shape[1]
    q = query.reshape(b, groups, (heads // groups) * q_len, dim)
    scores = torch.matmul(q, key.transpose(2, 3)) * (dim**-0.5 if scaling is None else scaling)
    if attention_mask is not None:
        mask = attention_mask[:, :, :, : key.shape[-2]]
        scores = scores + mask.repeat(1, 1, heads // groups, 1) if mask.shape[2] == q_len else scores + mask
    probs = torch.softmax(scores.to(torch.float32), dim=-1).to(query.dtype)
    out = torch.matmul(probs, value).reshape(b, heads, q_len, dim)
    return out.transpose(1, 2).contiguous(), None


def _ordered_head(drafter):  # -> Callable[[Tensor [1, 1, H]], Tensor [1, 1, V]]
    """transformers' ``Gemma4AssistantMaskedEmbedder`` in ops litert-torch converts (no scatter).

    Centroid logits → top-k centroids → the ``V / C`` tokens of each (``token_ordering``) scored against the
    tied embeddings; every other token gets (min of the scored ones − 1), as transformers does. The scored
    values are placed in the ordered ``[C, V / C]`` space by a one-hot matmul (each output gets exactly one
    product, so the values are exact), then read back in vocabulary order by a constant gather.
    """
    import torch

    embedder = drafter.masked_embedding
    ordering = embedder.token_ordering.detach().long()
    vocab, centroids, k = ordering.numel(), embedder.num_centroids, embedder.centroid_intermediate_top_k
    per_centroid = vocab // centroids
    clusters = ordering.view(centroids, per_centroid)
    inverse = torch.argsort(ordering)  # token v sits at inverse[v] of the ordered space
    everyone = torch.arange(centroids)

    def head(last):
        h = last.reshape(1, -1)
        _, top = torch.topk(embedder.centroids(h), k, dim=-1)  # [1, k]
        rows = clusters[top[0]]  # [k, V / C] token ids
        scored = (drafter.lm_head.weight[rows.reshape(-1)] @ h[0]).reshape(k, per_centroid)
        floor = scored.min() - 1.0
        onehot = (top[0][:, None] == everyone[None, :]).to(scored.dtype)  # [k, C]
        placed = onehot.transpose(0, 1) @ scored  # [C, V / C]
        ordered = torch.where(onehot.sum(0)[:, None] > 0, placed, floor)
        return ordered.reshape(-1)[inverse].reshape(1, 1, vocab)

    return head


def _drafter_step(drafter, target_text, kv):  # -> (torch.nn.Module, sample inputs, donor KV index per type)
    """The ``mtp_drafter`` module around a ``Gemma4AssistantForCausalLM``, its sample inputs, the KV it reads."""
    import torch

    text = drafter.config.get_text_config()
    layer_types = list(target_text.layer_types)
    first_shared = target_text.num_hidden_layers - (target_text.num_kv_shared_layers or 0)
    # KV tensor i of the target is its i-th non-shared layer; the drafter reads the last one of each type.
    donors = {kind: max(i for i in range(first_shared) if layer_types[i] == kind) for kind in set(layer_types)}
    cache_length = kv[f"kv_cache_k_{donors[layer_types[0]]}"][0][2]
    window = getattr(text, "sliding_window", None) or getattr(target_text, "sliding_window", None)
    neg = torch.finfo(torch.float32).min
    head = _ordered_head(drafter) if getattr(drafter, "masked_embedding", None) is not None else drafter.lm_head

    class MtpDrafter(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.drafter = drafter

        def forward(self, activations, input_pos, kv_cache):
            t = input_pos.to(torch.int64)  # [1]: the last position already in the target's cache
            p = torch.arange(cache_length, dtype=torch.int64)
            full = p <= t
            sliding = full & (p >= t + 2 - window) if window else full
            masks = {"full_attention": torch.where(full, 0.0, neg)[None, None, None, :],
                     "sliding_attention": torch.where(sliding, 0.0, neg)[None, None, None, :]}
            # litert-torch stores V transposed: [1, heads, head_dim, cache].
            shared = {kind: (kv_cache[f"k_{i}"], kv_cache[f"v_{i}"].transpose(2, 3)) for kind, i in donors.items()}
            x = self.drafter.pre_projection(activations)
            out = self.drafter.model(inputs_embeds=x, attention_mask=masks, position_ids=(t + 1)[None],
                                     shared_kv_states=shared, use_cache=False)
            last = out.last_hidden_state
            return {"logits": head(last).to(torch.float32),
                    "projected_activations": self.drafter.post_projection(last).to(torch.float32)}

    sample_kv = {}
    for i in sorted(set(donors.values())):
        for kind in ("k", "v"):
            shape, dtype = kv[f"kv_cache_{kind}_{i}"]
            sample_kv[f"{kind}_{i}"] = torch.zeros(shape, dtype=getattr(torch, dtype))
    hidden = target_text.hidden_size
    sample = {"activations": torch.zeros((1, 1, 2 * hidden), dtype=torch.float32),
              "input_pos": torch.zeros((1,), dtype=torch.int32), "kv_cache": sample_kv}
    return MtpDrafter().eval(), sample, donors


def _export_drafter(req, kv, path):  # -> dict
    import litert_torch
    import torch
    import transformers

    from edgekit.models.hfcompat import patch_transformers

    patch_transformers()
    transformers.AttentionInterface.register("edgekit_grouped", _grouped_attention)
    target_config = transformers.AutoConfig.from_pretrained(req["target"])
    drafter = transformers.Gemma4AssistantForCausalLM.from_pretrained(req["drafter"], dtype=torch.float32,
                                                                      attn_implementation="edgekit_grouped").eval()
    module, sample, donors = _drafter_step(drafter, target_config.get_text_config(), kv)
    converter = litert_torch.Converter()
    converter.add_signature("mtp_drafter", module, sample_kwargs=sample)
    converter.convert(strict_export=False).export(path)
    text = drafter.config.get_text_config()
    check = _self_check(drafter, module, sample, donors, path, getattr(text, "sliding_window", None))
    if req.get("quantization_recipe") not in (None, "none"):
        from litert_torch.generative.export_hf.core import export_lib

        quantized = export_lib.maybe_quantize_model(path, req["quantization_recipe"])
        if quantized != path:
            shutil.move(quantized, path)
    return {"reads": {kind: f"kv_cache_{{k,v}}_{i}" for kind, i in sorted(donors.items())}, "check": check}


def _self_check(drafter, module, sample, donors, path, window):  # -> dict
    """The converted drafter against its torch graph and against transformers' own drafter forward.

    Random target KV and activations; ``t`` inside the sliding window for the transformers check
    (there its window convention and llama.cpp's agree), ``t`` past it for the conversion check.
    """
    import torch
    from ai_edge_litert.interpreter import Interpreter

    gen = torch.Generator().manual_seed(0)
    kv = {name: torch.randn(t.shape, generator=gen) for name, t in sample["kv_cache"].items()}
    act = torch.randn(sample["activations"].shape, generator=gen)
    runner = Interpreter(model_path=path).get_signature_runner("mtp_drafter")
    cache = next(iter(kv.values())).shape[2]

    def converted(t):  # -> dict[str, Tensor]
        feeds = {"activations": act.numpy(), "input_pos": torch.tensor([t], dtype=torch.int32).numpy(),
                 **{f"kv_cache_{n}": v.numpy() for n, v in kv.items()}}
        return {k: torch.from_numpy(v) for k, v in runner(**feeds).items()}

    report = {}
    t_late = cache - 2
    with torch.no_grad():
        eager = module(act, torch.tensor([t_late], dtype=torch.int32), kv)
        got = converted(t_late)
        report["conversion_max_abs_diff"] = max(float((got[k] - eager[k]).abs().max()) for k in eager)
        t_early = max(0, min(cache - 2, (window or cache) - 2))
        shared = {kind: (kv[f"k_{i}"][:, :, :t_early + 1], kv[f"v_{i}"].transpose(2, 3)[:, :, :t_early + 1])
                  for kind, i in donors.items()}
        drafter.set_attn_implementation("eager")  # the reference is transformers' own attention
        try:
            ref = drafter(inputs_embeds=act, position_ids=torch.tensor([[t_early + 1]]), shared_kv_states=shared)
        finally:
            drafter.set_attn_implementation("edgekit_grouped")
        got = converted(t_early)
        logits = ref.logits if hasattr(ref, "logits") else ref[0]
        report["transformers_max_abs_diff_logits"] = float((got["logits"] - logits).abs().max())
        report["transformers_argmax_equal"] = bool(int(got["logits"].argmax()) == int(logits.argmax()))
    return report


def _bundle(target_bundle, drafter_tflite, out):  # -> None
    import litert_lm_builder as lb

    with tempfile.TemporaryDirectory(prefix="edgekit-litertlm-") as tmp:
        toml = lb.unpack(target_bundle, tmp)
        shutil.copy(drafter_tflite, os.path.join(tmp, "mtp_drafter.tflite"))
        with open(toml, "a") as fh:
            fh.write('\n[[section]]\nmodel_type = "mtp_drafter"\nsection_type = "TFLiteModel"\n'
                     'data_path = "mtp_drafter.tflite"\n')
        lb.pack(toml, out)


def main():  # -> None
    req = json.load(sys.stdin)
    out_dir = req["out_dir"]
    os.makedirs(out_dir, exist_ok=True)
    work = os.path.join(out_dir, "target")
    target_bundle = _export_target(req, work)
    with tempfile.TemporaryDirectory(prefix="edgekit-peek-") as peek:
        import litert_lm_builder as lb

        lb.unpack(target_bundle, peek)
        kv = _kv_layout(peek)
    drafter_path = os.path.join(out_dir, "mtp_drafter.tflite")
    facts = _export_drafter(req, kv, drafter_path)
    out = os.path.join(out_dir, "model.litertlm")
    _bundle(target_bundle, drafter_path, out)
    result = {"bundle": out, "draft_steps": req["draft_steps"], "kv_cache": sorted(kv), **facts}
    with open(os.path.join(out_dir, "export.json"), "w") as fh:  # stdout carries litert-torch's progress
        json.dump(result, fh)


if __name__ == "__main__":
    main()
