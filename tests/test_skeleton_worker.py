"""The skeleton worker's two shortcuts give what the converter's own code gives (run with the pinned gguf-py)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from build_helpers import sdist_or_skip

from edgekit.convert.llamacpp import LlamaCpp, find_llamacpp

WORKER = Path(__file__).resolve().parents[1] / "edgekit" / "convert" / "_skeleton.py"

# Runs beside the pinned tree: gguf-py first on sys.path, the worker loaded as a module (main() not run).
CHECK = textwrap.dedent('''
    import importlib.util, sys
    root, worker = sys.argv[1], sys.argv[2]
    sys.path[:0] = [root + "/gguf-py", root]
    import gguf
    spec = importlib.util.spec_from_file_location("skeleton_worker", worker)
    w = importlib.util.module_from_spec(spec); spec.loader.exec_module(w)
    vt = gguf.GGUFValueType
    n = 3000
    arrays = {
        "tokens": [f"tok{i}".encode() if i % 3 else f"tok{i}" for i in range(n)],  # bytes and str: both STRING
        "scores": [float(i) / 7 for i in range(n)],
        "types": [gguf.TokenType.NORMAL if i % 5 else gguf.TokenType.CONTROL for i in range(n)],  # IntEnum: INT32
        "ids": list(range(n)),
    }
    original = gguf.GGUFWriter(path=None, arch="llama")
    packed = {k: original._pack_val(v, vt.ARRAY, add_vtype=True) for k, v in arrays.items()}
    w._fast_arrays(gguf.GGUFWriter, gguf)
    fast = gguf.GGUFWriter(path=None, arch="llama")
    for k, v in arrays.items():
        assert fast._pack_val(v, vt.ARRAY, add_vtype=True) == packed[k], k
    for mixed in ([1] * n + [1.5], [b"a"] * n + [2], [1] * n + [True]):
        try:
            fast._pack_val(mixed, vt.ARRAY, add_vtype=True)
        except ValueError:
            pass
        else:
            raise AssertionError(f"mixed array of {sorted({type(x).__name__ for x in mixed})} was packed")

    from tokenizers import Tokenizer, models
    from transformers.tokenization_utils_tokenizers import TokenizersBackend
    backend = TokenizersBackend(tokenizer_object=Tokenizer(models.WordLevel({f"w{i}": i for i in range(50)}, "w0")))
    before = backend.get_vocab()
    w._one_vocab_build(TokenizersBackend)
    first = backend.get_vocab()
    assert first == before
    first["changed by a caller"] = 99
    assert backend.get_vocab() == before  # each caller has its own copy
    backend.add_tokens(["<new>"])
    assert backend.get_vocab()["<new>"] == 50  # a grown tokenizer is read again
    print("same")
''')


@pytest.fixture(scope="module")
def llama() -> LlamaCpp:
    return find_llamacpp(str(sdist_or_skip()))


def test_fast_metadata_arrays_and_one_vocab_build_match_the_converters_own(llama: LlamaCpp) -> None:
    proc = subprocess.run([sys.executable, "-c", CHECK, str(llama.root), str(WORKER)], capture_output=True,
                          text=True, env=llama.env(), timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "same"


# The worker's list-wise reading of the tokens against gguf-py's own LlamaHfVocab.all_tokens(),
# over a full-size Gemma 4 vocabulary with byte, special and added tokens.
TOKENS = textwrap.dedent('''
    import importlib.util, sys
    from pathlib import Path
    root, worker, model = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    sys.path[:0] = [root + "/gguf-py", root]
    import gguf
    spec = importlib.util.spec_from_file_location("skeleton_worker", worker)
    w = importlib.util.module_from_spec(spec); spec.loader.exec_module(w)
    real = gguf.LlamaHfVocab(model)
    expected = list(real.all_tokens())

    def slow():
        raise AssertionError("the one-pass reader fell back to hf_tokens")

    real.hf_tokens = slow
    got = list(zip(*w._token_lists(real, gguf.LlamaHfVocab)))
    assert len(got) == len(expected)
    assert got == expected, next(i for i, (a, b) in enumerate(zip(got, expected)) if a != b)
    assert all(type(t) is bytes and type(s) is float and type(k) is int for t, s, k in got)
    kinds = {k: sum(1 for _t, _s, t in got if t == k) for k in set(t for _t, _s, t in got)}
    print(len(got), len(real.added_tokens_list), kinds[gguf.TokenType.BYTE], kinds[gguf.TokenType.CONTROL],
          kinds[gguf.TokenType.USER_DEFINED])
''')


def test_one_pass_token_reading_matches_the_converters_reader(llama: LlamaCpp, tmp_path: Path) -> None:
    from transformers import PreTrainedTokenizerFast

    from edgekit.tinymodels.tokenizer import write_tokenizer

    size = write_tokenizer(tmp_path, vocab_size=262_144, layout="gemma4")
    tok = PreTrainedTokenizerFast.from_pretrained(tmp_path)
    tok.add_tokens(["<edgekit_added_a>", "<edgekit_added_b>"])  # ids past the base vocabulary
    tok.add_special_tokens({"additional_special_tokens": ["<edgekit_special>"]})
    tok.save_pretrained(tmp_path)
    proc = subprocess.run([sys.executable, "-c", TOKENS, str(llama.root), str(WORKER), str(tmp_path)],
                          capture_output=True, text=True, env=llama.env(), timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    total, added, byte, control, user = map(int, proc.stdout.split())
    assert (total, added, byte) == (size + 3, 3, 256)
    assert control > 3 and user == 2  # the specials of the head, and the two plain added tokens
