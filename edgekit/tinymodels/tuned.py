"""A tiny Gemma 4 target with something to predict: the random tiny target, briefly fine-tuned on text.

A random tiny target (:mod:`edgekit.tinymodels.legacy` or ``published``) is chaotic: its attention
logits are unit-norm q·k at scale 1 (near-hard attention on random keys) and its next-token
distribution is almost flat (top probability ≈ 0.004 of 400 tokens), so its argmax is a hash of the
whole context that no 32-wide drafter can follow (measured: held-out step-1 agreement stays near 2%
while training agreement climbs).
A user's fine-tuned target is not like that. This one is the same checkpoint fine-tuned for a few
hundred steps on the bundled prompt text (seconds on one core): its continuations are English-like
and peaked (top probability ≈ 0.55), which is the situation alignment is for — a moved target and
a drafter that no longer fits it. Deterministic in ``seed``.
"""

from __future__ import annotations

import random
import tempfile
from collections.abc import Callable
from pathlib import Path

TUNE_STEPS = 200
TUNE_LR = 3e-3
WINDOW = 64
BATCH = 16


def _corpus() -> str:
    from importlib import resources

    from edgekit.models.prompt_lines import parse_prompts

    return "\n".join(parse_prompts(resources.files("edgekit").joinpath("data/align_prompts.txt").read_text()))


def finetune_target(src: Path, out_dir: Path, seed: int = 0, steps: int = TUNE_STEPS, lr: float = TUNE_LR,
                    batch: int = BATCH, threads: int = 1) -> Path:
    """Fine-tune the Gemma 4 target in ``src`` on the bundled prompt text; write it to ``out_dir`` (bf16)."""
    import torch
    import torch.nn.functional as F
    import transformers
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    from edgekit.models.validate import inspect_model

    hf_logging.disable_progress_bar()
    arch = inspect_model(Path(src), "target").architecture
    before = torch.get_num_threads()
    torch.set_num_threads(threads)  # one thread: deterministic, and fastest on a shared 2-core box
    try:
        tok = AutoTokenizer.from_pretrained(src)
        model = getattr(transformers, arch).from_pretrained(src, dtype=torch.float32)
        ids = torch.tensor(tok(_corpus()).input_ids)
        torch.manual_seed(seed)
        rng = random.Random(seed)
        opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
        model.train()
        for _ in range(steps):
            starts = [rng.randrange(0, len(ids) - WINDOW - 1) for _ in range(batch)]
            x = torch.stack([ids[s:s + WINDOW] for s in starts])
            y = torch.stack([ids[s + 1:s + WINDOW + 1] for s in starts])
            logits = model(input_ids=x).logits
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        model.eval()
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        model.to(torch.bfloat16).save_pretrained(out_dir, safe_serialization=True)
        tok.save_pretrained(out_dir)
    finally:
        torch.set_num_threads(before)
    return out_dir


def make_tuned_target(out_dir: Path, seed: int, base: Callable[[Path, int], Path], steps: int = TUNE_STEPS) -> Path:
    """Write the random target ``base`` makes for ``seed``, fine-tuned for ``steps`` steps, to ``out_dir`` (bf16)."""
    import shutil

    with tempfile.TemporaryDirectory(prefix="edgekit-tiny-") as tmp:
        src = base(Path(tmp) / "target", seed)
        finetune_target(src, out_dir, seed, steps)
        _keep_what_transformers_skips(src, Path(out_dir))
        shutil.copy2(src / "config.json", Path(out_dir) / "config.json")  # the base's own spelling of it
        if (src / "preprocessor_config.json").exists():
            shutil.copy2(src / "preprocessor_config.json", Path(out_dir) / "preprocessor_config.json")
        return Path(out_dir)


def _keep_what_transformers_skips(src: Path, out_dir: Path) -> None:
    """Tensors transformers does not load (the KV-shared layers' k/v projections) are not saved either: copy
    them from the base checkpoint, so the tuned one has the published tensor set too."""
    from safetensors.torch import load_file, save_file

    base, tuned = load_file(src / "model.safetensors"), load_file(out_dir / "model.safetensors")
    missing = {k: v for k, v in base.items() if k not in tuned}
    if missing:
        save_file(dict(sorted({**tuned, **missing}.items())), out_dir / "model.safetensors", metadata={"format": "pt"})


__all__ = ["finetune_target", "make_tuned_target"]
