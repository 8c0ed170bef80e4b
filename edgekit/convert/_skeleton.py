"""Worker run with the pinned llama.cpp tree first on sys.path: the converter's GGUF without its big weights.

Reads JSON on stdin ``{"model": DIR, "outtype": "bf16"|"f32", "out": PATH, "vocab": NPZ|null}``. Runs the
converter's own model class as ``convert_hf_to_gguf.py`` does (metadata, tokenizer, tensor names, order, types and every
tensor transform), but leaves out the data of each 2-D weight a Q4_0 repack would replace, so those are
never read, widened or written: the converter's lazy tensors are only evaluated for what is written.
Writes PATH (the metadata and the small tensors, byte for byte as the converter writes them) and prints
``{"arch": ..., "tensors": [{"name", "ne", "type", "in_file"}, ...]}`` in the converter's order.

With ``vocab``, the converter's tokenizer reader (``gguf.LlamaHfVocab``: transformers' tokenizer, then
262,144 tokens read one by one) is answered from that file when it exists, and fills it when not: the
caller names it by the tokenizer files, which every Gemma 4 model shares.

Run as a script (``python _skeleton.py LLAMA_CPP_ROOT``), never imported: the vendored gguf-py must shadow
any installed ``gguf``.
"""

import json
import logging
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

BLOCK = 32


def left_out(name: str, shape: tuple, f32: bool, all_f32: bool) -> bool:
    """The weights a repack quantizes (a subset of edgekit.convert.repack.quantizable, which must agree)."""
    if len(shape) < 2 or shape[-1] % BLOCK or not name.endswith(".weight") or name.endswith("_norm.weight"):
        return False
    return not f32 or all_f32


def _fast_arrays(writer_cls: type, gguf: object) -> None:
    """The writer's metadata packing, one struct call per array instead of per element: the same bytes.

    gguf-py packs each of the vocabulary's 262,144 tokens, scores and types with its own call (1.6 s of
    this worker's 7 s on Gemma's vocabulary); long arrays of strings and numbers are packed whole here,
    anything else (and big-endian files) goes to the original.
    """
    import struct

    original = writer_cls._pack_val
    vt = gguf.GGUFValueType

    def pack_val(self, val, vtype, add_vtype, sub_type=None):  # type: ignore[no-untyped-def]
        if vtype != vt.ARRAY or not isinstance(val, list) or len(val) < 1024 \
                or self.endianess != gguf.GGUFEndian.LITTLE:
            return original(self, val, vtype, add_vtype, sub_type)
        ltype = sub_type if sub_type is not None else vt.get_type(val[0])
        # get_type looks at the type alone, so one item of each distinct type stands for all of them.
        if sub_type is None and any(vt.get_type(next(v for v in val if type(v) is t)) is not ltype
                                    for t in set(map(type, val))):
            raise ValueError("All items in a GGUF array should be of the same type")
        head = (struct.pack("<I", vtype) if add_vtype else b"") + struct.pack("<IQ", ltype, len(val))
        fmt = self._simple_value_packing.get(ltype)
        if ltype == vt.STRING:
            enc = [v.encode("utf-8") if isinstance(v, str) else v for v in val]
            return head + b"".join(struct.pack("<Q", len(e)) + e for e in enc)
        if fmt is not None and ltype != vt.BOOL:
            return head + struct.pack(f"<{len(val)}{fmt}", *val)
        return original(self, val, vtype, add_vtype, sub_type)

    writer_cls._pack_val = pack_val


def _one_vocab_build(backend: type) -> None:
    """transformers' fast-tokenizer ``get_vocab``, built once while the tokenizer's size stays the same.

    The converter's vocabulary reader asks for the whole 262,144-entry dict once per special token and
    once more for the tokens (7 times, ≈ 0.3 s each); each caller gets its own copy of the one build.
    """
    original = backend.get_vocab

    def get_vocab(self):  # type: ignore[no-untyped-def]
        size = self._tokenizer.get_vocab_size(with_added_tokens=True)
        cached = self.__dict__.get("_edgekit_vocab")
        if cached is None or cached[0] != size:
            cached = (size, original(self))
            self.__dict__["_edgekit_vocab"] = cached
        return dict(cached[1])

    backend.get_vocab = get_vocab


_BYTE_TOKEN = re.compile(rb"<0x[0-9A-Fa-f]{2}>")
# Work for later runs (filling the vocabulary cache), done once the listing is out: edgekit does not wait on it.
AFTER_LISTING: list[Callable[[], None]] = []


def _token_lists(real: Any, reader: type) -> tuple[list[bytes], list[float], list[int]]:
    """``real.all_tokens()`` of gguf-py's ``LlamaHfVocab`` as (texts, scores, types), base tokens read at once.

    Its ``hf_tokens`` asks for each of the 262,144 ids in turn (a regex and two method calls per token:
    0.7 s, on the critical path of a repack with nothing cached); here the same rules run over the
    reversed vocabulary as list operations: a token is BYTE if it is ``<0xXX>``, else CONTROL if its id
    is special, else NORMAL; its score is ``real.get_token_score(id)``; added tokens come from ``real``
    itself. A test compares both over a full Gemma 4 vocabulary. Any other reader, or any surprise,
    takes the reader's own path.
    """
    if type(real) is reader:
        try:
            return _base_lists(real)
        except Exception:  # the reader's own path, with its own error if there is one
            pass
    items = list(real.all_tokens())
    return ([t if isinstance(t, bytes) else t.encode("utf-8") for t, _, _ in items],
            [float(s) for _, s, _ in items], [int(k) for _, _, k in items])


def _base_lists(real: Any) -> tuple[list[bytes], list[float], list[int]]:
    import gguf

    n = real.vocab_size_base
    reverse: list[str | None] = [None] * n
    for text, i in real.tokenizer.get_vocab().items():
        if 0 <= i < n:
            reverse[i] = text
    added = real.added_tokens_ids
    ids = [i for i in range(n) if i not in added] if any(0 <= i < n for i in added) else range(n)
    texts = [reverse[i].encode("utf-8") for i in ids]  # None: a hole in the vocabulary (KeyError there)
    scores = [float(x) for x in map(real.get_token_score, ids)]
    types = [int(gguf.TokenType.NORMAL)] * len(texts)
    at = None if isinstance(ids, range) else {i: j for j, i in enumerate(ids)}
    for i in real.special_ids:
        j = (i if 0 <= i < n else None) if at is None else at.get(i)
        if j is not None:
            types[j] = int(gguf.TokenType.CONTROL)
    for j in [j for j, t in enumerate(texts) if t[:3] == b"<0x"]:  # BYTE before CONTROL, as there
        if _BYTE_TOKEN.fullmatch(texts[j]):
            types[j] = int(gguf.TokenType.BYTE)
    for text, score, kind in real.added_tokens():
        texts.append(text if isinstance(text, bytes) else text.encode("utf-8"))
        scores.append(float(score))
        types.append(int(kind))
    return texts, scores, types


def _cached_vocab(gguf: object, path: Path) -> None:
    """``gguf.LlamaHfVocab`` answered from ``path`` (tokens, scores, types): the same values, read once.

    Only ``all_tokens()`` and ``vocab_size`` are served from the file (all the Gemma 4 reader uses);
    anything else is asked of the real reader.
    """
    import numpy as np

    original = gguf.LlamaHfVocab

    class CachedHfVocab:
        def __init__(self, base_path: Path) -> None:
            self._base, self._real = base_path, None
            try:
                with np.load(path, allow_pickle=False) as z:
                    blob, ends, self._scores, self._types = (z["blob"].tobytes(), z["ends"].tolist(),
                                                             z["scores"].tolist(), z["types"].tolist())
                    self.vocab_size = int(z["vocab_size"])
                self._tokens = [blob[a:b] for a, b in zip([0, *ends[:-1]], ends, strict=True)]
                print(f"vocabulary: {len(self._tokens)} tokens from {path}", file=sys.stderr)
            except (OSError, KeyError, ValueError):
                real = self._reader()
                self._tokens, self._scores, self._types = _token_lists(real, original)
                self.vocab_size = int(real.vocab_size)  # the converter checks it against the token count
                AFTER_LISTING.append(self._save)

        def _reader(self):  # type: ignore[no-untyped-def]
            if self._real is None:
                self._real = original(self._base)
            return self._real

        def _save(self) -> None:
            tmp = path.with_name(f".{path.name}.{os.getpid()}.npz")
            path.parent.mkdir(parents=True, exist_ok=True)
            np.savez(tmp, blob=np.frombuffer(b"".join(self._tokens), dtype=np.uint8),
                     ends=np.cumsum([len(t) for t in self._tokens], dtype=np.int64),
                     scores=np.array(self._scores, dtype=np.float64), types=np.array(self._types, dtype=np.int64),
                     vocab_size=np.int64(self.vocab_size))
            os.replace(tmp, path)
            print(f"vocabulary: {len(self._tokens)} tokens read from the tokenizer, kept in {path}", file=sys.stderr)

        def all_tokens(self):  # type: ignore[no-untyped-def]
            return zip(self._tokens, self._scores, self._types, strict=True)

        def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
            return getattr(self._reader(), name)

    gguf.LlamaHfVocab = CachedHfVocab


def main() -> None:
    root = Path(sys.argv[1])
    sys.path[:0] = [str(root / "gguf-py"), str(root)]
    logging.disable(logging.WARNING)
    import gguf
    import torch
    from conversion import ModelType, get_model_architecture, get_model_class
    from conversion.base import ModelBase

    _fast_arrays(gguf.GGUFWriter, gguf)
    try:
        from transformers.tokenization_utils_tokenizers import TokenizersBackend
    except ImportError:  # another transformers: its own get_vocab, the same bytes, slower
        pass
    else:
        _one_vocab_build(TokenizersBackend)

    req = json.load(sys.stdin)
    if req.get("vocab"):
        _cached_vocab(gguf, Path(req["vocab"]))
    model_dir, out = Path(req["model"]), Path(req["out"])
    ftype = {"bf16": gguf.LlamaFileType.MOSTLY_BF16, "f32": gguf.LlamaFileType.ALL_F32}[req["outtype"]]
    with torch.inference_mode():
        hparams = ModelBase.load_hparams(model_dir, False)
        cls = get_model_class(get_model_architecture(hparams, ModelType.TEXT))
        model = cls(model_dir, ftype, out)
        model.prepare_tensors()  # lazy: nothing is read yet
        model.prepare_metadata(vocab_only=False)
        writer = model.gguf_writer
        if len(writer.tensors) != 1:
            raise SystemExit("a split GGUF cannot be a repack template")
        tensors, listed = writer.tensors[0], []
        all_f32 = ftype == gguf.LlamaFileType.ALL_F32
        for name, ti in list(tensors.items()):
            shape = tuple(int(x) for x in ti.shape)
            skip = left_out(name, shape, ti.dtype == gguf.GGMLQuantizationType.F32, all_f32)
            listed.append({"name": name, "ne": list(reversed(shape)), "type": int(ti.dtype), "in_file": not skip})
            if skip:
                del tensors[name]
        writer.write_header_to_file(path=out)
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file(progress=False)
        writer.close()
    json.dump({"arch": gguf.MODEL_ARCH_NAMES[cls.model_arch], "tensors": listed}, sys.stdout)


if __name__ == "__main__":
    main()
    # Done: the file is closed and the listing written; closing stdout tells edgekit so. What is left (the
    # vocabulary cache) it collects at its end, and the interpreter's own teardown (torch's and transformers'
    # modules, ≈ 0.5 s) would only be waited on.
    sys.stdout.flush()
    os.close(1)
    for job in AFTER_LISTING:
        job()
    sys.stderr.flush()
    os._exit(0)
