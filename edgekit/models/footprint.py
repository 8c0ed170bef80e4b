"""What a Gemma 4 model holds, counted from its config alone, before a byte of it is downloaded: its parameters
(the matrices a converter quantizes; the norms, scales and router it keeps in F32), the share of them one token
reads (a mixture of experts reads its top-k experts) and the KV cache each token adds, layer by layer.

Counted as transformers lays the models out (``Gemma4ForConditionalGeneration``'s text model,
``Gemma4AssistantForCausalLM``) and checked against generated models' checkpoints and GGUFs element for element
(tests/test_footprint.py). The text model only: a vision or audio tower is llama.cpp's mmproj, sized apart.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from edgekit.errors import EdgekitError

# Bytes per weight of a matrix at each of a recipe's quantizations (ggml's block sizes: Q4_0 is 18 bytes per 32
# weights, Q8_0 34 per 32, Q6_K 210 per 256; the K-quant mixes at llama.cpp's published bits per weight).
BYTES_PER_WEIGHT = {"q4_0-exact": 18 / 32, "Q4_0": 18 / 32, "Q4_K_M": 4.89 / 8, "Q5_K_M": 5.69 / 8,
                    "Q6_K": 210 / 256, "Q8_0": 34 / 32, "F16": 2.0, "BF16": 2.0, "as-is": 2.0, "F32": 4.0}
# A GGUF's vocabulary in its header: each token's text, score and type (≈ 6 MB for Gemma's 262,144).
HEADER_BYTES_PER_TOKEN = 24


@dataclass(frozen=True)
class LayerShape:
    full: bool  # full attention (else sliding-window)
    q_heads: int
    kv_heads: int
    head_dim: int
    owns_kv: bool  # keeps a cache of its own; a KV-shared layer reads an earlier layer's
    kv_proj: bool  # has K (and V) projections: an assistant's layers have none, they read the target's cache
    v_proj: bool  # K = V (``attention_k_eq_v``) on full layers: no V projection there
    ffn: int  # the dense MLP's width (the shared expert's, in a mixture of experts)
    experts: int = 0
    expert_ffn: int = 0
    top_k: int = 0


def swa_cells(ctx: int, parallel: int, window: int, ubatch: int = 512) -> int:
    """Token cells llama-server's cache of ``ctx`` (its -c, split over ``parallel`` slots, -np, each a stream of
    its own) gives its sliding-window layers: per slot its last ``window`` tokens plus one batch in flight, padded
    to 256 cells, never more than the slot's share (llama-kv-cache-iswa.cpp)."""
    slots = max(1, parallel)
    if not window:
        return ctx
    per_slot = min(ctx // slots, window + ubatch)
    return slots * -(-per_slot // 256) * 256


@dataclass(frozen=True)
class KvBytes:
    """A cache's bytes per cached token, full-attention and sliding-window layers apart (release.json's
    ``kv_layout``: the bench sizes each context length's cache from it)."""

    full_per_token: int
    swa_per_token: int
    window: int

    def at(self, ctx: int, parallel: int) -> int:
        return self.full_per_token * ctx + self.swa_per_token * swa_cells(ctx, parallel, self.window)

    @property
    def per_token_upper(self) -> int:
        """Were every layer's cache as long as the context (the loose bound older releases recorded)."""
        return self.full_per_token + self.swa_per_token

    def to_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class KvLayout:
    """K and V values one cached token adds, full-attention and sliding-window layers apart (a sliding layer keeps
    at most ``window`` tokens of each sequence)."""

    full_k: int
    full_v: int
    swa_k: int
    swa_v: int
    window: int

    def in_bytes(self, k_bytes: float, v_bytes: float) -> KvBytes:
        return KvBytes(int(self.full_k * k_bytes + self.full_v * v_bytes),
                       int(self.swa_k * k_bytes + self.swa_v * v_bytes), self.window)

    def to_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


def sum_layouts(layouts: list[KvLayout]) -> KvLayout:
    """Two models' caches as one (a target and its drafter; the wider window bounds both)."""
    return KvLayout(sum(x.full_k for x in layouts), sum(x.full_v for x in layouts), sum(x.swa_k for x in layouts),
                    sum(x.swa_v for x in layouts), max((x.window for x in layouts), default=0))


@dataclass(frozen=True)
class Footprint:
    vocab: int
    hidden: int
    layers: tuple[LayerShape, ...]
    per_layer_input: int  # E2B/E4B: each layer's slice of a per-token table (0: none)
    window: int
    context: int  # max_position_embeddings
    backbone: int | None = None  # an assistant: its target's hidden size
    centroids: int = 0  # an assistant's ordered-embedding head
    centroid_top_k: int = 0

    @property
    def assistant(self) -> bool:
        return self.backbone is not None

    @property
    def heads(self) -> int:
        """Query heads of its widest attention layer: how wide its attention scores are."""
        return max((s.q_heads for s in self.layers), default=0)

    def _layer(self, s: LayerShape) -> tuple[int, int, int]:
        """(matrix weights, F32 weights, the experts' share of the matrices) of one layer."""
        h = self.hidden
        q = s.q_heads * s.head_dim * h
        kv = s.kv_heads * s.head_dim * h
        matrix = 2 * q + (kv if s.kv_proj else 0) + (kv if s.v_proj else 0) + 3 * h * s.ffn
        f32 = 4 * h + 1 + s.head_dim * (2 if s.kv_proj else 1)  # 4 norms, layer scalar, q (and k) norm
        experts = 3 * s.experts * h * s.expert_ffn
        if s.experts:
            f32 += s.experts * h + h + s.experts + 3 * h  # router (kept F32), its scales, the MoE's three norms
        if self.per_layer_input:
            matrix += 2 * self.per_layer_input * h
            f32 += h
        return matrix + experts, f32, experts

    def parameters(self) -> tuple[int, int]:
        """(matrix weights, F32 weights) of the whole text model."""
        h, n = self.hidden, len(self.layers)
        matrix, f32 = self.vocab * h, h  # the embedding (the tied head too) and the final norm
        if self.per_layer_input:
            matrix += self.vocab * n * self.per_layer_input + n * self.per_layer_input * h
            f32 += self.per_layer_input
        if self.backbone:
            matrix += 3 * self.backbone * h + self.centroids * h  # pre- and post-projection, centroids
        for s in self.layers:
            m, f, _ = self._layer(s)
            matrix, f32 = matrix + m, f32 + f
        return matrix, f32

    def tensor_bytes(self, quant: str) -> int:
        """The GGUF's tensors at ``quant``: matrices quantized, the rest F32, and the proportional RoPE's
        frequency factors llama.cpp's converter adds (half a full layer's head)."""
        if quant not in BYTES_PER_WEIGHT:
            raise EdgekitError(f"no size is known for quantization {quant!r}.")
        matrix, f32 = self.parameters()
        rope = max((s.head_dim for s in self.layers if s.full), default=0) // 2
        return int(matrix * BYTES_PER_WEIGHT[quant] + 4 * (f32 + rope))

    def weight_bytes(self, quant: str) -> int:
        """The GGUF file at ``quant``, near enough: its tensors and the vocabulary in its header."""
        return self.tensor_bytes(quant) + self.vocab * HEADER_BYTES_PER_TOKEN

    def active_matrix(self) -> int:
        """Matrix weights one decode step reads: all but the per-layer table (a row per token is looked up) and
        the experts a token is not routed to; the tied head reads the whole embedding (an ordered head only its
        centroids and the top-k centroids' tokens)."""
        matrix, _ = self.parameters()
        n = len(self.layers)
        if self.per_layer_input:
            matrix -= self.vocab * n * self.per_layer_input
        for s in self.layers:
            if s.experts:
                matrix -= self._layer(s)[2] * (s.experts - s.top_k) // s.experts
        if self.centroids:
            matrix -= self.vocab * self.hidden - self.centroid_top_k * (self.vocab // self.centroids) * self.hidden
        return matrix

    def active_bytes(self, quant: str) -> int:
        """Bytes one decode step reads at ``quant``: the active matrices and the F32 weights, of the per-expert
        scales only the routed experts'."""
        unrouted_scales = sum(s.experts - s.top_k for s in self.layers if s.experts)
        return int(self.active_matrix() * BYTES_PER_WEIGHT[quant] + 4 * (self.parameters()[1] - unrouted_scales))

    def kv(self) -> KvLayout:
        """The cache llama.cpp keeps for this model: the layers that own one. K = V layers still keep a V cache
        there (gemma4.cpp passes Kcur as Vcur into a cache with both), so they cost what other layers do; an
        assistant owns none (it reads its target's last sliding and full layers)."""
        full_k = swa_k = 0
        for s in self.layers:
            if s.owns_kv:
                values = s.kv_heads * s.head_dim
                full_k, swa_k = (full_k + values, swa_k) if s.full else (full_k, swa_k + values)
        return KvLayout(full_k, full_k, swa_k, swa_k, self.window)


def _int(text: dict[str, Any], *keys: str) -> int:
    for key in keys:
        if text.get(key):
            return int(text[key])
    return 0


def footprint(config: dict[str, Any]) -> Footprint:
    """A Gemma 4 target's or assistant's footprint from its ``config.json``."""
    text = config.get("text_config") or config
    try:
        types = list(text["layer_types"])
        hidden, heads, kv_heads = int(text["hidden_size"]), int(text["num_attention_heads"]), int(
            text["num_key_value_heads"])
        head_dim, vocab = int(text["head_dim"]), int(text["vocab_size"])
    except (KeyError, TypeError, ValueError) as exc:
        raise EdgekitError(f"the config is not a Gemma 4 text config (no {exc}).") from None
    backbone = config.get("backbone_hidden_size")
    n, shared = len(types), _int(text, "num_kv_shared_layers")
    moe = bool(text.get("enable_moe_block"))
    layers = []
    for i, kind in enumerate(types):
        full = kind == "full_attention"
        owns = i < n - shared
        layers.append(LayerShape(
            full=full, q_heads=heads, owns_kv=owns, kv_proj=backbone is None,
            kv_heads=_int(text, "num_global_key_value_heads", "num_key_value_heads") if full else kv_heads,
            head_dim=_int(text, "global_head_dim", "head_dim") if full else head_dim,
            v_proj=backbone is None and not (full and text.get("attention_k_eq_v")),
            ffn=int(text["intermediate_size"]) * (2 if text.get("use_double_wide_mlp") and not owns else 1),
            experts=_int(text, "num_experts") if moe else 0,
            expert_ffn=_int(text, "moe_intermediate_size", "expert_intermediate_size") if moe else 0,
            top_k=_int(text, "top_k_experts") if moe else 0))
    ordered = bool(config.get("use_ordered_embeddings"))
    return Footprint(vocab=vocab, hidden=hidden, layers=tuple(layers),
                     per_layer_input=_int(text, "hidden_size_per_layer_input"), window=_int(text, "sliding_window"),
                     context=_int(text, "max_position_embeddings"), backbone=int(backbone) if backbone else None,
                     centroids=_int(config, "num_centroids") if ordered else 0,
                     centroid_top_k=_int(config, "centroid_intermediate_top_k") if ordered else 0)
