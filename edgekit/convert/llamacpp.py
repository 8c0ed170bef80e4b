"""The pinned llama.cpp pieces convert uses: convert_hf_to_gguf.py (+ its gguf-py) and llama-quantize.

The converter always runs as a subprocess with the tree's own gguf-py first on PYTHONPATH: the
PyPI ``gguf`` may lag the tree (0.19.0 on PyPI has no ``gemma4-assistant``), and the converter's
Python state (torch, lazy tensors) stays out of edgekit's process.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import importlib.machinery
import importlib.util
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from edgekit.convert._namemap import light_map
from edgekit.errors import EdgekitError

CONVERTER_OUTTYPES = {"F32": "f32", "F16": "f16", "BF16": "bf16", "Q8_0": "q8_0"}
_NAMEMAP = Path(__file__).with_name("_namemap.py")


@dataclass(frozen=True)
class LlamaCpp:
    """A llama.cpp source tree (for the converter) and, optionally, a directory of built tools."""

    root: Path
    identity: str  # what store keys depend on (commit or tarball hash)
    commit: str | None
    bin_dir: Path | None = None

    @property
    def script(self) -> Path:
        return self.root / "convert_hf_to_gguf.py"

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(self.root / "gguf-py"), env.get("PYTHONPATH")) if p)
        env.setdefault("PYTHONUNBUFFERED", "1")
        return env

    def to_dict(self) -> dict[str, Any]:
        return {"root": str(self.root), "identity": self.identity, "commit": self.commit,
                "bin_dir": str(self.bin_dir) if self.bin_dir else None}

    def convert(self, model_dir: Path, outfile: Path, outtype: str, log: Path, mmproj: bool = False) -> None:
        """convert_hf_to_gguf.py MODEL --outfile OUT --outtype T [--mmproj]; its output goes to ``log``."""
        argv = [sys.executable, str(self.script), str(model_dir), "--outfile", str(outfile), "--outtype", outtype,
                *(["--mmproj"] if mmproj else [])]
        _run(argv, self.env(), log, f"convert_hf_to_gguf.py on {model_dir.name}")
        if not outfile.is_file():
            raise EdgekitError(f"The converter wrote no {outfile.name}; see {log}.")

    def tool(self, name: str) -> Path:
        if self.bin_dir is None:
            raise EdgekitError(f"{name} is needed but no llama.cpp build was given (edgekit build --target host).")
        path = self.bin_dir / name
        if not path.is_file():
            raise EdgekitError(f"{path} does not exist; build llama.cpp for the host first.")
        return path

    def quantize(self, src: Path, dst: Path, qtype: str, log: Path, threads: int | None = None) -> None:
        argv = [str(self.tool("llama-quantize")), str(src), str(dst), qtype]
        if threads:
            argv.append(str(threads))
        _run(argv, None, log, f"llama-quantize to {qtype}")

    def gguf_names(self, config: dict[str, Any], names: list[str],
                   light: bool = False) -> tuple[str, dict[str, str | None]]:
        """(GGUF arch, HF name → GGUF name or None) as this tree's converter maps them.

        ``light`` skips importing the converter (torch, transformers: ≈ 3 s) and applies its Gemma 4
        rules with the tree's gguf-py tensor map, in this process; see ``_namemap.py``.
        """
        if light:
            tables = pinned_tables(str(self.root))
            if tables is not None:
                try:
                    return light_map(tables, config, names)
                except ValueError as exc:
                    raise EdgekitError(f"The pinned converter cannot map this model's tensors: {exc}") from None
        request = json.dumps({"config": config, "names": names, "light": light}, sort_keys=True)
        arch, mapping = _names_cached(str(self.root), request)
        return arch, dict(mapping)


@functools.lru_cache(maxsize=4)
def pinned_tables(root: str) -> SimpleNamespace | None:
    """The tree's gguf-py ``constants`` and ``tensor_mapping``, loaded in this process under a private name.

    They are all the light name map needs, and they import nothing else: loaded here they cost ≈ 10 ms,
    where the subprocess (an interpreter, numpy and the whole gguf-py) took ≈ 0.4 s of a core, beside
    the converter's worker that a repack starts at the same time. The private package name keeps them
    apart from the installed ``gguf``. None when they do not load alone (another tree layout): then the
    subprocess answers.
    """
    pkg_dir = Path(root) / "gguf-py" / "gguf"
    name = f"_edgekit_pinned_gguf_{hashlib.sha256(root.encode()).hexdigest()[:12]}"
    try:
        package = importlib.util.module_from_spec(importlib.machinery.ModuleSpec(name, None, is_package=True))
        package.__path__ = [str(pkg_dir)]
        sys.modules[name] = package
        constants = importlib.import_module(f"{name}.constants")
        mapping = importlib.import_module(f"{name}.tensor_mapping")
        return SimpleNamespace(MODEL_ARCH=constants.MODEL_ARCH, MODEL_ARCH_NAMES=constants.MODEL_ARCH_NAMES,
                               get_tensor_name_map=mapping.get_tensor_name_map)
    except Exception:  # any failure here only means: ask the subprocess
        for mod in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
            del sys.modules[mod]
        return None


@functools.lru_cache(maxsize=16)
def _names_cached(root: str, request: str) -> tuple[str, tuple[tuple[str, str | None], ...]]:
    # The worker imports torch through the converter (seconds): ask once per model and tree.
    proc = subprocess.run([sys.executable, str(_NAMEMAP), root], input=request, capture_output=True, text=True,
                          env=LlamaCpp(Path(root), "", None).env(), check=False)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise EdgekitError(f"The pinned converter cannot map this model's tensors: {last}")
    out = json.loads(proc.stdout)
    return out["arch"], tuple(out["map"].items())


def _run(argv: list[str], env: dict[str, str] | None, log: Path, what: str) -> None:
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as fh:
        fh.write(("$ " + " ".join(argv) + "\n").encode())
        fh.flush()
        proc = subprocess.run(argv, stdout=fh, stderr=subprocess.STDOUT, env=env, check=False)
    if proc.returncode != 0:
        tail = log.read_text(errors="replace").strip().splitlines()[-1:] or ["no output"]
        raise EdgekitError(f"{what} failed (exit {proc.returncode}): {tail[0][:300]} (log: {log}).")


def find_llamacpp(src: str | None = None, bin_dir: str | Path | None = None, need_tools: bool = False) -> LlamaCpp:
    """The pinned tree (``src``, $EDGEKIT_LLAMA_SRC, else the PyPI sdist) and, if asked, host tools.

    Tools come from ``bin_dir``, $EDGEKIT_LLAMA_BIN, else edgekit's cached host CPU build (built on
    first use, 5 to 15 min on 2 cores).
    """
    from edgekit.build import fetch_sdist, resolve_source

    src = src or os.environ.get("EDGEKIT_LLAMA_SRC") or str(fetch_sdist())
    source = resolve_source(src)
    if not (source.path / "convert_hf_to_gguf.py").is_file():
        raise EdgekitError(f"{source.path} has no convert_hf_to_gguf.py.")
    bin_path = Path(bin_dir) if bin_dir else (Path(os.environ["EDGEKIT_LLAMA_BIN"])
                                              if os.environ.get("EDGEKIT_LLAMA_BIN") else None)
    if bin_path is None and need_tools:
        bin_path = host_tools(src)
    return LlamaCpp(source.path, source.identity, source.commit, bin_path)


def host_tools(src: str) -> Path:
    """bin/ of the host CPU build of the pinned tree (the build stage's cache; built if missing)."""
    from edgekit.build import BuildOptions, build

    return build(BuildOptions(target="host", cpu_only=True, src=src)).bin_dir

