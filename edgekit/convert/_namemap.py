"""Worker run with the pinned llama.cpp tree on sys.path: HF tensor names → the GGUF names its
converter writes. Uses the converter's own class (its ``filter_tensors`` skips and renames) and its
gguf-py tensor map, so edgekit never keeps a second copy of those rules. Reads JSON on stdin
``{"config": {...}, "names": [...]}``; writes ``{"arch": ..., "map": {hf: gguf|null}}``.

Run as a script (``python _namemap.py LLAMA_CPP_ROOT``), never imported: the vendored gguf-py
must shadow any installed ``gguf``.
"""

import json
import logging
import sys
from pathlib import Path


def main() -> None:
    root = Path(sys.argv[1])
    sys.path[:0] = [str(root / "gguf-py"), str(root)]
    logging.disable(logging.WARNING)
    import gguf
    from conversion import ModelType, get_model_architecture, get_model_class

    req = json.load(sys.stdin)
    config = req["config"]
    hf_arch = get_model_architecture(config, ModelType.TEXT)
    cls = get_model_class(hf_arch)
    text = config.get("text_config") or config
    n_blocks = next(text[k] for k in ("n_layers", "num_hidden_layers", "n_layer", "num_layers") if k in text)
    tmap = gguf.get_tensor_name_map(cls.model_arch, n_blocks)
    out = {}
    for name in req["names"]:
        item = cls.filter_tensors((name, lambda: None))
        out[name] = None if item is None else tmap.get_name(key=item[0], try_suffixes=(".weight", ".bias"))
    json.dump({"arch": gguf.MODEL_ARCH_NAMES[cls.model_arch], "map": out}, sys.stdout)


if __name__ == "__main__":
    main()
