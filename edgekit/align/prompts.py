"""The prompt set an alignment run continues: bundled default or a user file, split train / held-out."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from edgekit.errors import EdgekitError
from edgekit.models.prompt_lines import parse_prompts

HELDOUT_EVERY = 5  # one prompt in five is held out, chosen by a hash of its text (stable under reordering)
MIN_PROMPTS = 10


@dataclass(frozen=True)
class PromptSet:
    source: str  # "default" or the file's path
    sha256: str  # of the prompts as used (after comment/blank removal), for the store key
    train: tuple[str, ...]
    heldout: tuple[str, ...]

    def to_dict(self) -> dict[str, object]:
        return {"source": self.source, "sha256": self.sha256, "train": len(self.train), "heldout": len(self.heldout)}


def _is_heldout(prompt: str) -> bool:
    return hashlib.sha256(prompt.encode()).digest()[0] % HELDOUT_EVERY == 0


def load_prompts(data: str = "default", base_dir: Path | None = None) -> PromptSet:
    if data == "default":
        text = resources.files("edgekit").joinpath("data/align_prompts.txt").read_text(encoding="utf-8")
        source = "default"
    else:
        path = Path(data).expanduser()
        if not path.is_absolute() and base_dir is not None and not path.exists():
            path = base_dir / path
        if not path.is_file():
            raise EdgekitError(f"The prompt file {path} does not exist.")
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise EdgekitError(f"Cannot read the prompt file {path}: {exc}.") from None
        source = str(path)
    prompts = list(dict.fromkeys(parse_prompts(text)))  # duplicates would leak between the splits
    heldout = tuple(p for p in prompts if _is_heldout(p))
    train = tuple(p for p in prompts if not _is_heldout(p))
    if len(prompts) < MIN_PROMPTS or not heldout or not train:
        raise EdgekitError(f"The prompt set {source} has {len(prompts)} distinct prompts; alignment needs at least "
                           f"{MIN_PROMPTS} (one in {HELDOUT_EVERY} is held out to measure acceptance).")
    digest = hashlib.sha256("\n".join(prompts).encode()).hexdigest()
    return PromptSet(source, digest, train, heldout)


__all__ = ["PromptSet", "load_prompts", "parse_prompts"]
