"""The local artifact store: each artifact is a directory of files plus a manifest.

Artifacts live at ``<store>/<kind>/<key>/`` where ``key`` is the sha256 of the canonical JSON
of the stage's inputs, so a stage whose inputs did not change finds its artifact and is skipped.
Every file is also listed with its sha256 and size, which is what the board-side store
(``<base>/store/<sha256>``) is keyed by.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgekit.errors import EdgekitError
from edgekit.paths import store_dir

MANIFEST = "manifest.json"
_CHUNK = 1 << 20


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def canonical_json(data: Any) -> str:
    return json.dumps(data, sort_keys=True, separators=(",", ":"), default=str)


@dataclass(frozen=True)
class Artifact:
    kind: str
    key: str
    path: Path
    manifest: dict[str, Any]

    def file(self, name: str) -> Path:
        path = self.path / name
        if not path.is_file():
            raise EdgekitError(f"Artifact {self.kind}/{self.key[:12]} has no file named {name!r}.")
        return path

    @property
    def files(self) -> list[dict[str, Any]]:
        return list(self.manifest.get("files", []))


class Store:
    def __init__(self, root: Path | None = None) -> None:
        self.root = Path(root) if root else store_dir()

    @staticmethod
    def key(inputs: Mapping[str, Any]) -> str:
        return hashlib.sha256(canonical_json(dict(inputs)).encode()).hexdigest()

    def _dir(self, kind: str, key: str) -> Path:
        if not kind.replace("-", "").replace("_", "").isalnum() or not all(
            c in "0123456789abcdef" for c in key
        ):
            raise EdgekitError(f"Invalid artifact reference {kind}/{key}.")
        return self.root / kind / key

    def get(self, kind: str, key: str) -> Artifact | None:
        path = self._dir(kind, key)
        manifest_path = path / MANIFEST
        if not manifest_path.is_file():
            return None
        manifest = json.loads(manifest_path.read_text())
        return Artifact(kind, key, path, manifest)

    def staging_dir(self) -> Path:
        """A fresh directory on the store's filesystem, so put() can rename instead of copy."""
        self.root.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix=".staging-", dir=self.root))

    def put(self, kind: str, key: str, src_dir: Path, manifest: Mapping[str, Any]) -> Artifact:
        """Move every file of ``src_dir`` into the store as one artifact, atomically.

        The artifact appears complete or not at all: files and manifest are written into a
        staging directory that is renamed into place last.
        """
        final = self._dir(kind, key)
        src_dir = Path(src_dir)
        staging = self.staging_dir()
        try:
            files = []
            for src in sorted(p for p in src_dir.rglob("*") if p.is_file() or p.is_symlink()):
                rel = src.relative_to(src_dir)
                if rel.as_posix() == MANIFEST:
                    continue
                dst = staging / rel
                dst.parent.mkdir(parents=True, exist_ok=True)
                shutil.move(str(src), dst)
                if dst.is_symlink():
                    continue
                files.append({"name": rel.as_posix(), "sha256": sha256_file(dst), "size": dst.stat().st_size})
            full = dict(manifest)
            full.update(
                kind=kind,
                key=key,
                created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                files=files,
            )
            (staging / MANIFEST).write_text(json.dumps(full, indent=2, sort_keys=True) + "\n")
            final.parent.mkdir(parents=True, exist_ok=True)
            if final.exists():
                shutil.rmtree(final)
            os.rename(staging, final)
            if src_dir.parent == self.root and src_dir.name.startswith(".staging-"):
                shutil.rmtree(src_dir, ignore_errors=True)  # a staging_dir() handed in, now empty
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        return Artifact(kind, key, final, full)

    def list(self, kind: str | None = None) -> list[Artifact]:
        kinds = [kind] if kind else sorted(p.name for p in self.root.glob("*") if p.is_dir())
        out: list[Artifact] = []
        for k in kinds:
            for path in sorted((self.root / k).glob("*")):
                art = self.get(k, path.name) if not path.name.startswith(".") else None
                if art:
                    out.append(art)
        return out
