"""The GGUF files a release serves: converted from the recipe's models, or shipped by a package.

A redeploy whose inputs did not change must not pay for validating checkpoints and importing torch
again: the answer is remembered under a key made only of cheap facts (the recipe's model sections,
file fingerprints of local models, generator fingerprints of synthetic ones, the llama.cpp source),
and trusted only while every remembered file still has its size and mtime.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any

from rich.console import Console

from edgekit import __version__
from edgekit.config.recipes import ModelSource, Recipe
from edgekit.engines.llamacpp.packaged_gguf import packaged_gguf
from edgekit.errors import EdgekitError
from edgekit.paths import cache_dir, store_dir

_COMMIT = re.compile(r"^[0-9a-f]{40}$")


def resolve_models(recipe: Recipe, console: Console, src: str | None = None) -> dict[str, Path]:
    """{"models/target.gguf": path, "models/drafter.gguf": path} — converted only when inputs changed."""
    key = memo_key(recipe, src)
    if key is not None and (remembered := _recall(key)) is not None:
        return remembered
    out: dict[str, Path] = {}
    for role, source in (("target", recipe.target), ("drafter", recipe.drafter)):
        if source is not None and source.package is not None:
            art = packaged_gguf(source.package)
            out[f"models/{role}.gguf"] = art.file(art.manifest["model_file"])
    if len(out) < (2 if recipe.drafter else 1):
        if not recipe.convert.gguf:
            raise EdgekitError(f"Recipe {recipe.name} turns GGUF conversion off, but llama-server needs GGUF files.")
        from edgekit.prepare.pipeline import convert_recipe

        # The GGUFs alone: a LiteRT-LM bundle the recipe also lists (convert.litert) is not llama-server's.
        result = convert_recipe(recipe, src=src, say=lambda m: console.print(f"[dim]convert: {m}[/dim]"),
                                formats=("gguf",))
        for conv in result.models:
            out[f"models/{conv.role}.gguf"] = conv.file
    if key is not None:
        _remember(key, out)
    return out


def _source_identity(source: ModelSource, base_dir: Path | None) -> Any:
    """What the converted file depends on, from stat calls and small files only; None: not knowable cheaply."""
    from edgekit.convert.inputs import dir_fingerprint, synthetic_fingerprint

    if source.package is not None:
        from importlib import metadata

        name = source.package.partition("==")[0]
        try:
            return {"package": source.package, "version": metadata.version(name)}
        except metadata.PackageNotFoundError:
            return None  # let the full path say so
    if source.synthetic is not None:
        return {"synthetic": source.synthetic, "generator": synthetic_fingerprint(source.synthetic)}
    if source.path is not None:
        path = source.local_path(base_dir or Path.cwd())
        return {"path": str(path.resolve()), "fingerprint": dir_fingerprint(path)} if path and path.is_dir() else None
    if source.repo is not None and source.revision and _COMMIT.match(source.revision):
        return {"repo": source.repo, "revision": source.revision}  # a commit pins the content; a branch does not
    return None


def _file_identity(path: Path) -> list[Any]:
    st = path.stat()
    return [str(path.resolve()), st.st_size, st.st_mtime_ns]


def memo_key(recipe: Recipe, src: str | None) -> str | None:
    sources = [s for s in (recipe.target, recipe.drafter) if s is not None]
    idents = [_source_identity(s, recipe.base_dir) for s in sources]
    if any(i is None for i in idents):
        return None
    if src is None:
        llama: Any = "pinned"  # the pinned commit, from git or the sdist: the same converter either way
    elif Path(src).is_file():
        llama = _file_identity(Path(src))
    else:
        return None  # a source dir would need a walk of the tree: not cheap, so not remembered
    # The store too: the memo names files in it, and a deploy with another EDGEKIT_STORE converts into that one.
    doc = {"edgekit": __version__, "code": _code_fingerprint(), "idents": idents, "llama": llama,
           "store": str(store_dir().resolve()),
           "sources": [s.model_dump(mode="json") for s in sources], "convert": recipe.convert.model_dump(mode="json")}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:24]


def _code_fingerprint() -> str:
    """The code that turns sources into GGUFs: a change to it must not be answered from the memo."""
    root = Path(__file__).resolve().parents[2]  # edgekit/
    digest = hashlib.sha256()
    files = [f for pkg in ("prepare", "convert", "align", "models") for f in sorted((root / pkg).glob("*.py"))]
    for f in [*files, root / "config" / "align_spec.py", root / "config" / "synthetic.py"]:
        digest.update(f.name.encode() + b"\0" + f.read_bytes())
    return digest.hexdigest()[:16]


def _memo_path(key: str) -> Path:
    return cache_dir() / "memo" / f"deploy-models-{key}.json"


def _recall(key: str) -> dict[str, Path] | None:
    try:
        files = json.loads(_memo_path(key).read_text())["files"]
        if all(_file_identity(Path(ident[0])) == ident for ident in files.values()):
            return {rel: Path(ident[0]) for rel, ident in files.items()}
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        pass
    return None


def _remember(key: str, files: dict[str, Path]) -> None:
    path = _memo_path(key)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(json.dumps({"files": {rel: _file_identity(p) for rel, p in files.items()}}))
    os.replace(tmp, path)
