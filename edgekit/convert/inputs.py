"""Where a recipe's model comes from, as a local directory plus an identity for store keys.

- ``repo`` + ``revision``: ``huggingface_hub.snapshot_download`` into the normal HF cache (it
  honours ``HF_HUB_OFFLINE``, ``HF_TOKEN`` and ``HF_HOME`` itself); the identity is the commit.
- ``path``: a local HF-layout directory; the identity is a fingerprint of its files.
- ``synthetic``: generated once by :mod:`edgekit.tinymodels` into the cache.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgekit import optional
from edgekit.errors import EdgekitError
from edgekit.paths import build_dir_once, cache_dir

if TYPE_CHECKING:
    from edgekit.config.recipes import ModelSource

# Only what conversion reads: configs, tokenizer, weights (never the original/*.pth or GGUFs).
HF_PATTERNS = ["*.json", "*.safetensors", "tokenizer.model", "*.jinja", "*.txt"]


@dataclass(frozen=True)
class ModelInput:
    role: str  # "target" or "drafter"
    path: Path
    identity: dict[str, Any] = field(default_factory=dict)  # what the store key depends on

    @property
    def label(self) -> str:
        return str(self.identity.get("repo") or self.identity.get("synthetic") or self.path)


def dir_fingerprint(path: Path) -> str:
    """Name, size and mtime of every file: cheap, and changes when any file is replaced."""
    digest = hashlib.sha256()
    for p in sorted(path.rglob("*")):
        if p.is_file() and not p.name.startswith("."):
            st = p.stat()
            digest.update(f"{p.relative_to(path)}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:24]


def _from_hub(repo: str, revision: str) -> tuple[Path, str]:
    optional.require(f"fetching {repo} from Hugging Face", optional.extra(None, only={"huggingface-hub"}))
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    try:
        local = Path(snapshot_download(repo_id=repo, revision=revision, allow_patterns=HF_PATTERNS))
    except GatedRepoError:
        raise EdgekitError(f"{repo} is gated: accept its license on the Hub and set HF_TOKEN.") from None
    except RepositoryNotFoundError:
        raise EdgekitError(f"No model repo {repo} on the Hub (or it is private: set HF_TOKEN).") from None
    except RevisionNotFoundError:
        raise EdgekitError(f"{repo} has no revision {revision!r}.") from None
    except LocalEntryNotFoundError:
        offline = os.environ.get("HF_HUB_OFFLINE", "") not in ("", "0", "false", "False")
        why = "HF_HUB_OFFLINE is set and it is not in the cache" if offline else "the Hub cannot be reached"
        raise EdgekitError(f"Cannot get {repo}@{revision}: {why}.") from None
    except HfHubHTTPError as exc:
        raise EdgekitError(f"Downloading {repo}@{revision} failed: {str(exc).splitlines()[0]}.") from None
    except OSError as exc:
        raise EdgekitError(f"Downloading {repo}@{revision} failed: {exc}.") from None
    # snapshot_download returns .../snapshots/<commit>: the commit pins the content.
    return local, local.name


def synthetic_fingerprint(name: str) -> str:
    """Changes whenever the generator of ``name`` would write different bytes."""
    from edgekit.tinymodels import fingerprint

    return fingerprint()


def synthetic_dir(name: str, seed: int = 0) -> Path:
    return cache_dir() / "synthetic" / f"{name}-{synthetic_fingerprint(name)}-s{seed}"


def ensure_synthetic(name: str, seed: int = 0) -> Path:
    """Generate a synthetic checkpoint once; it appears at its final path only when complete."""
    from edgekit.tinymodels import SYNTHETIC_MAKERS

    if name not in SYNTHETIC_MAKERS:
        raise EdgekitError(f"Unknown synthetic model {name!r} (known: {', '.join(SYNTHETIC_MAKERS)}).")

    def make(tmp: Path) -> Path:
        optional.require(f"generating the tiny model {name}", optional.extra("convert"))  # torch, transformers
        return SYNTHETIC_MAKERS[name](tmp, seed)

    return build_dir_once(synthetic_dir(name, seed), "config.json", make)


def resolve(source: ModelSource, role: str, base_dir: Path | None = None, seed: int = 0) -> ModelInput:
    """A local HF-layout directory for a recipe's target or drafter (downloads/generates as needed)."""
    if source.repo:
        assert source.revision is not None
        path, commit = _from_hub(source.repo, source.revision)
        return ModelInput(role, path, {"repo": source.repo, "revision": source.revision, "commit": commit})
    if source.synthetic:
        path = ensure_synthetic(source.synthetic, seed)
        return ModelInput(role, path, {"synthetic": source.synthetic,
                                       "generator": synthetic_fingerprint(source.synthetic), "seed": seed})
    if source.path:
        path = source.local_path(base_dir or Path.cwd())
        assert path is not None
        if not path.is_dir():
            raise EdgekitError(f"The {role} model directory {path} does not exist.")
        path = path.resolve()
        return ModelInput(role, path, {"path": str(path), "fingerprint": dir_fingerprint(path)})
    raise EdgekitError(f"The {role} comes from package {source.package!r}, which ships a GGUF: "
                       "there is nothing to convert.")
