"""The local artifact store: atomic puts, lookups by input key, manifests with hashes."""

from __future__ import annotations

import hashlib
from pathlib import Path

from edgekit.store import Store


def test_put_get_and_skip(tmp_path: Path) -> None:
    store = Store(tmp_path / "store")
    key = store.key({"ref": "abc", "flags": ["-DX=1"]})
    assert key == store.key({"flags": ["-DX=1"], "ref": "abc"})  # canonical: order does not matter
    assert store.get("build", key) is None
    staging = store.staging_dir()
    (staging / "bin").mkdir()
    (staging / "bin" / "tool").write_bytes(b"hello")
    art = store.put("build", key, staging, {"target": "host"})
    assert not staging.exists()  # the staging dir handed in is consumed
    again = store.get("build", key)
    assert again is not None and again.manifest["target"] == "host"
    entry = again.files[0]
    assert entry == {"name": "bin/tool", "sha256": hashlib.sha256(b"hello").hexdigest(), "size": 5}
    assert art.file("bin/tool").read_bytes() == b"hello"
    assert [a.key for a in store.list("build")] == [key]
    assert not [p for p in (tmp_path / "store").iterdir() if p.name.startswith(".staging-")]
