"""Tiny BPE tokenizers in the shape llama.cpp's Gemma 4 converter reads, in two layouts.

- ``legacy``: ``<pad> <eos> <bos> <unk> <start_of_turn> <end_of_turn>`` at ids 0-5 (edgekit's first tiny models);
- ``gemma4``: the published Gemma 4 ids: 0-5 ``<pad> <eos> <bos> <unk> <mask> [multimodal]``, 105/106 the turn
  markers ``<|turn>`` / ``<turn|>`` (106 is the second EOS of the -it models), the image/audio/video markers at
  the end of the vocabulary, and a Gemma 4 style chat template.
"""

from __future__ import annotations

import itertools
from collections import Counter
from pathlib import Path

SPECIALS = ("<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>")  # legacy ids 0-5
PAD_ID, EOS_ID, BOS_ID, UNK_ID = 0, 1, 2, 3
SPACE = "\u2581"  # ▁: SentencePiece-style space marker that Gemma's BPE uses
VOCAB_SIZE = 400

TURN_START, TURN_END = "<|turn>", "<turn|>"
GEMMA4_HEAD = ("<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "[multimodal]",
               *(f"<unused{i}>" for i in range(99)), TURN_START, TURN_END)  # ids 0-106, as published
END_OF_TURN_ID = GEMMA4_HEAD.index(TURN_END)  # 106
# Media markers (published ids 255999…258884), last in the vocabulary: name -> the config key that points at it.
MEDIA = {"<|image>": "boi_token_id", "<image|>": "eoi_token_id", "<|image|>": "image_token_id",
         "<|audio>": "boa_token_id", "<audio|>": "eoa_token_id", "<|audio|>": "audio_token_id",
         "<|video|>": "video_token_id"}

# A Gemma 4 style template: <|turn>role\n … <turn|>\n, the model's turn opened by add_generation_prompt,
# OpenAI content parts with images/audio as their soft-token markers.
CHAT_TEMPLATE = (
    "{{- bos_token -}}"
    "{%- for m in messages -%}"
    "{{- '<|turn>' + ('model' if m['role'] == 'assistant' else m['role']) + '\\n' -}}"
    "{%- if m['content'] is string -%}{{- m['content'] | trim -}}"
    "{%- else -%}{%- for part in m['content'] -%}"
    "{%- if part['type'] == 'text' -%}{{- part['text'] | trim -}}"
    "{%- elif part['type'] in ('image', 'image_url') -%}{{- '<|image|>' -}}"
    "{%- elif part['type'] in ('audio', 'input_audio') -%}{{- '<|audio|>' -}}"
    "{%- endif -%}{%- endfor -%}{%- endif -%}"
    "{{- '<turn|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|turn>model\\n' -}}{%- endif -%}"
)

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


def media_token_ids(vocab_size: int) -> dict[str, int]:
    """The config keys of the media markers (``image_token_id`` …) and their ids in a ``gemma4`` vocab."""
    first = vocab_size - len(MEDIA)
    return {key: first + i for i, key in enumerate(MEDIA.values())}


def write_tokenizer(out_dir: Path, vocab_size: int = VOCAB_SIZE, layout: str = "legacy") -> int:
    """Write tokenizer.json + tokenizer_config.json in the shape llama.cpp's Gemma 4 converter reads.

    That shape (checked by ``gguf.LlamaHfVocab``): a BPE model with ``byte_fallback``, the 256
    ``<0xXX>`` tokens, and a ``Sequence`` decoder (▁→space, ByteFallback, Fuse). Returns the vocab size.
    """
    from tokenizers import Tokenizer, decoders, models, normalizers
    from transformers import PreTrainedTokenizerFast

    head, tail = (SPECIALS, ()) if layout == "legacy" else (GEMMA4_HEAD, tuple(MEDIA))
    unused_from = 0 if layout == "legacy" else 99  # <unused0..98> already sit in the gemma4 head
    bytes_ = [f"<0x{b:02X}>" for b in range(256)]
    base = len(head) + len(bytes_)
    alphabet, merges = _learn_merges(_CORPUS, n_merges=vocab_size)  # cut below
    vocab: dict[str, int] = {}
    for tok in (*head, *bytes_, *alphabet):
        vocab.setdefault(tok, len(vocab))
    kept: list[tuple[str, str]] = []
    for a, b in merges:
        if len(vocab) >= vocab_size - len(tail):
            break
        if a + b not in vocab:
            vocab[a + b] = len(vocab)
            kept.append((a, b))
    # Past the learned merges, fill up with Gemma-style <unusedN> tokens (big vocabularies for benchmarks).
    for i in range(vocab_size - len(tail) - len(vocab)):
        vocab[f"<unused{unused_from + i}>"] = len(vocab)
    for tok in tail:
        vocab[tok] = len(vocab)
    assert len(vocab) > base and len(vocab) == vocab_size

    tok = Tokenizer(models.BPE(vocab=vocab, merges=kept, unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Replace(" ", SPACE)
    tok.decoder = decoders.Sequence([decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()])
    extra = (["<start_of_turn>", "<end_of_turn>"] if layout == "legacy"
             else ["<mask>", "[multimodal]", TURN_START, TURN_END, *MEDIA])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>", unk_token="<unk>", pad_token="<pad>",
        additional_special_tokens=extra,
    )
    fast.add_bos_token = True
    if layout != "legacy":
        fast.chat_template = CHAT_TEMPLATE
    out_dir.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(out_dir)
    return len(vocab)


__all__ = ["BOS_ID", "CHAT_TEMPLATE", "END_OF_TURN_ID", "EOS_ID", "MEDIA", "PAD_ID", "SPECIALS", "UNK_ID",
           "VOCAB_SIZE", "media_token_ids", "write_tokenizer"]
