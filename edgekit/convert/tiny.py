"""Tiny Gemma 4 checkpoints generated locally: a target, its MTP assistant drafter, a tokenizer.

They have the real layouts (``Gemma4ForConditionalGeneration`` and ``Gemma4AssistantForCausalLM``,
per-layer inputs, mixed sliding/full attention, shared KV), so the pinned llama.cpp converter,
llama-server's ``draft-mtp`` and litert-torch treat them exactly like E2B/E4B, in seconds and
without any download. Everything is deterministic in ``seed``.
"""

from __future__ import annotations

import hashlib
import itertools
from collections import Counter
from pathlib import Path

from edgekit.convert.hfcompat import patch_transformers

SPECIALS = ("<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>")  # ids 0-5, as in Gemma
PAD_ID, EOS_ID, BOS_ID, UNK_ID = 0, 1, 2, 3
SPACE = "\u2581"  # ▁: SentencePiece-style space marker that Gemma's BPE uses
VOCAB_SIZE = 400
QAT_BLOCK = 32

# Fixed corpus for the BPE merges; any change changes every tiny checkpoint (and its store keys).
_CORPUS = """
The quick brown fox jumps over the lazy dog. A small model runs on the edge of the network.
Speculative decoding lets a small drafter guess the next tokens and the target model checks them.
Gemma runs on Jetson boards with llama.cpp and LiteRT. The drafter reads the hidden state of the
target and shares its cache. Every weight of a quantized model sits on a grid of sixteen levels.
Once upon a time there was a robot that counted tokens per second and watts per token.
What is the capital of France? Paris is the capital of France. One two three four five six seven.
"""


def _learn_merges(corpus: str, n_merges: int) -> tuple[list[str], list[tuple[str, str]]]:
    """Plain BPE on words (``▁word``): most frequent pair first, ties broken lexicographically."""
    words = Counter(SPACE + w for w in corpus.split())
    seqs = {w: list(w) for w in words}
    alphabet = sorted({c for w in words for c in w})
    merges: list[tuple[str, str]] = []
    for _ in range(n_merges):
        pairs: Counter[tuple[str, str]] = Counter()
        for w, n in words.items():
            s = seqs[w]
            for a, b in itertools.pairwise(s):
                pairs[(a, b)] += n
        if not pairs:
            break
        best = min(pairs, key=lambda p: (-pairs[p], p))
        merges.append(best)
        for w in words:
            s, out, i = seqs[w], [], 0
            while i < len(s):
                if i + 1 < len(s) and (s[i], s[i + 1]) == best:
                    out.append(s[i] + s[i + 1])
                    i += 2
                else:
                    out.append(s[i])
                    i += 1
            seqs[w] = out
    return alphabet, merges


def write_tokenizer(out_dir: Path, vocab_size: int = VOCAB_SIZE) -> int:
    """Write tokenizer.json + tokenizer_config.json in the shape llama.cpp's Gemma 4 converter reads.

    That shape (checked by ``gguf.LlamaHfVocab``): a BPE model with ``byte_fallback``, the 256
    ``<0xXX>`` tokens, and a ``Sequence`` decoder (▁→space, ByteFallback, Fuse). Returns the vocab size.
    """
    from tokenizers import Tokenizer, decoders, models, normalizers
    from transformers import PreTrainedTokenizerFast

    bytes_ = [f"<0x{b:02X}>" for b in range(256)]
    base = len(SPECIALS) + len(bytes_)
    alphabet, merges = _learn_merges(_CORPUS, n_merges=vocab_size)  # cut below
    vocab: dict[str, int] = {}
    for tok in (*SPECIALS, *bytes_, *alphabet):
        vocab.setdefault(tok, len(vocab))
    kept: list[tuple[str, str]] = []
    for a, b in merges:
        if len(vocab) >= vocab_size:
            break
        if a + b not in vocab:
            vocab[a + b] = len(vocab)
            kept.append((a, b))
    # Past the learned merges, fill up with Gemma-style <unusedN> tokens (big vocabularies for benchmarks).
    for i in range(vocab_size - len(vocab)):
        vocab[f"<unused{i}>"] = len(vocab)
    assert len(vocab) > base

    tok = Tokenizer(models.BPE(vocab=vocab, merges=kept, unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Replace(" ", SPACE)
    tok.decoder = decoders.Sequence([decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>", unk_token="<unk>", pad_token="<pad>",
        additional_special_tokens=["<start_of_turn>", "<end_of_turn>"],
    )
    fast.add_bos_token = True
    out_dir.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(out_dir)
    return len(vocab)


def target_config(vocab_size: int):  # -> Gemma4Config
    from transformers import Gemma4Config, Gemma4TextConfig

    text = Gemma4TextConfig(
        vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
        num_attention_heads=2, num_key_value_heads=1, head_dim=32, global_head_dim=64,
        layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
        sliding_window=16, vocab_size_per_layer_input=vocab_size, hidden_size_per_layer_input=16,
        num_kv_shared_layers=2, final_logit_softcapping=30.0, max_position_embeddings=2048,
        pad_token_id=PAD_ID, eos_token_id=EOS_ID, bos_token_id=BOS_ID,
    )
    return Gemma4Config(text_config=text, vision_config=None, audio_config=None,
                        pad_token_id=PAD_ID, eos_token_id=EOS_ID, bos_token_id=BOS_ID)


def drafter_config(vocab_size: int, backbone_hidden_size: int = 64):  # -> Gemma4AssistantConfig
    from transformers import Gemma4AssistantConfig, Gemma4TextConfig

    text = Gemma4TextConfig(
        vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, head_dim=32, global_head_dim=64,
        layer_types=["sliding_attention", "full_attention"], sliding_window=16,
        vocab_size_per_layer_input=0, hidden_size_per_layer_input=0, num_kv_shared_layers=2,
        final_logit_softcapping=30.0, max_position_embeddings=2048,
        pad_token_id=PAD_ID, eos_token_id=EOS_ID, bos_token_id=BOS_ID,
    )
    return Gemma4AssistantConfig(text_config=text, backbone_hidden_size=backbone_hidden_size,
                                 pad_token_id=PAD_ID, eos_token_id=EOS_ID, bos_token_id=BOS_ID)


def snap_to_grid(weight, seed: int, block: int = QAT_BLOCK):  # torch.Tensor -> torch.Tensor (bf16)
    """Put a 2-D weight on a QAT-like 4-bit grid: per block of ``block`` values, w = q·d, q ∈ [-8, 7].

    d is a power of two times 1, 1.125, …, 1.875 (4 significant bits), so q·d has at most 8
    significant bits and is exact in bf16, and d itself is exact in fp16: what Google's QAT
    checkpoints look like, and what an exact Q4_0 repack can store without loss.
    """
    import torch

    rows, cols = weight.shape
    assert cols % block == 0, "last dimension must be a multiple of the block size"
    g = torch.Generator().manual_seed(seed)
    w = weight.detach().float().reshape(-1, block)
    amax = w.abs().amax(dim=1, keepdim=True).clamp_min(1e-8)
    exp = torch.floor(torch.log2(amax / 8))
    frac = torch.randint(0, 8, amax.shape, generator=g).float()
    d = torch.ldexp(1 + frac / 8, exp.int())
    q = torch.clamp(torch.round(w / d), -8, 7)
    return (q * d).reshape(rows, cols).to(torch.bfloat16)


def _qat_copy(model, seed: int) -> None:
    import torch

    with torch.no_grad():
        for i, (_name, p) in enumerate(sorted(model.named_parameters())):
            if p.dim() == 2 and p.shape[1] % QAT_BLOCK == 0:
                p.copy_(snap_to_grid(p, seed * 1000 + i).to(p.dtype))


def _save(model, out_dir: Path, vocab_size: int) -> Path:
    import torch
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # "Writing model shards" bars are noise in CLI/JSON output

    model = model.to(torch.bfloat16)  # the real QAT checkpoints are bf16 safetensors
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    write_tokenizer(out_dir, vocab_size)
    return out_dir


def make_target(out_dir: Path, seed: int = 0, qat: bool = False) -> Path:
    import torch
    from transformers import Gemma4ForConditionalGeneration

    vocab_size = write_tokenizer(out_dir)
    torch.manual_seed(seed)
    model = Gemma4ForConditionalGeneration(target_config(vocab_size)).eval()
    if qat:
        _qat_copy(model, seed)
    return _save(model, out_dir, vocab_size)


def make_drafter(out_dir: Path, seed: int = 0, qat: bool = False, backbone_hidden_size: int = 64) -> Path:
    import torch
    from transformers import Gemma4AssistantForCausalLM

    patch_transformers()
    vocab_size = write_tokenizer(out_dir)
    torch.manual_seed(seed + 1)
    model = Gemma4AssistantForCausalLM(drafter_config(vocab_size, backbone_hidden_size)).eval()
    # transformers' assisted generation reads this; without it generate(assistant_model=...) fails.
    model.generation_config.num_assistant_tokens = 3
    if qat:
        _qat_copy(model, seed + 1)
    return _save(model, out_dir, vocab_size)


def make_tiny_pair(out_dir: Path, seed: int = 0, qat: bool = False) -> tuple[Path, Path]:
    """Write ``out_dir/target`` and ``out_dir/drafter`` (HF layout, bf16 safetensors, tokenizer)."""
    out_dir = Path(out_dir)
    return (make_target(out_dir / "target", seed, qat), make_drafter(out_dir / "drafter", seed, qat))


def ensure_tiny_pair(root: Path, seed: int = 0, qat: bool = False) -> tuple[Path, Path]:
    """:func:`make_tiny_pair` into ``root/<variant>`` once; later calls reuse it (atomic rename)."""
    from edgekit.paths import build_dir_once

    final = build_dir_once(Path(root) / f"tiny{'-qat' if qat else ''}-s{seed}", "drafter/config.json",
                           lambda tmp: make_tiny_pair(tmp, seed, qat))
    return final / "target", final / "drafter"


SYNTHETIC_MAKERS = {
    "tiny-gemma4": lambda d, seed: make_target(d, seed, qat=False),
    "tiny-gemma4-qat": lambda d, seed: make_target(d, seed, qat=True),
    "tiny-gemma4-assistant": lambda d, seed: make_drafter(d, seed, qat=False),
    "tiny-gemma4-assistant-qat": lambda d, seed: make_drafter(d, seed, qat=True),
    "tiny-gemma4-tuned": lambda d, seed: _tuned_target(d, seed),
}


def _tuned_target(out_dir: Path, seed: int) -> Path:
    """The random target fine-tuned on text: a target that a small drafter can learn to follow."""
    from edgekit.align.tinytarget import make_tuned_target  # trains with torch: imported on demand

    return make_tuned_target(out_dir, seed)


def tiny_fingerprint() -> str:
    """Changes whenever the generator would write different bytes (for store keys)."""
    return hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:16]


__all__ = ["SYNTHETIC_MAKERS", "ensure_tiny_pair", "make_drafter", "make_target", "make_tiny_pair", "snap_to_grid",
           "tiny_fingerprint", "write_tokenizer"]
