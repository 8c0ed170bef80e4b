"""LiteRT-LM bundles (``.litertlm``) of a Gemma 4 target with litert-torch's HF exporter.

litert-torch (0.10.0) pulls tensorflow-cpu, jax and torchao, so edgekit does not import it: the
exporter, ``litert-lm-peek`` and the ``litert_lm`` smoke run all run in a subprocess of the Python
that has them (``$EDGEKIT_LITERT_PYTHON``, else this interpreter). Its HF exporter imports
``tensorflow.lite.python.schema_py_generated``: install ``tensorflow-cpu==2.21.0`` next to it.

The MTP drafter is not part of the bundle: LiteRT-LM's speculative decoding needs a
``tf_lite_mtp_drafter`` section that no public exporter writes (its own issue).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgekit.errors import EdgekitError
from edgekit.models.inputs import ModelInput
from edgekit.models.validate import ModelInfo
from edgekit.store import Artifact, Store

QUANT_RECIPES = {"int8": "dynamic_wi8_afp32", "none": None}
_SMOKE = Path(__file__).with_name("_litert_smoke.py")


def litert_python() -> str:
    return os.environ.get("EDGEKIT_LITERT_PYTHON") or sys.executable


def _bin(python: str, name: str) -> str:
    """A console script installed next to ``python`` (venvs put them side by side)."""
    candidate = Path(python).parent / name
    return str(candidate) if candidate.exists() else name


def available(python: str | None = None) -> bool:
    python = python or litert_python()
    proc = subprocess.run([python, "-c", "import litert_torch, litert_lm"], capture_output=True, check=False)
    return proc.returncode == 0


@dataclass(frozen=True)
class LitertExport:
    path: Path
    sections: list[str]
    quant: str
    prefill_lengths: list[int]
    cache_length: int

    def to_dict(self) -> dict[str, Any]:
        return {"path": str(self.path), "sections": self.sections, "quant": self.quant,
                "prefill_lengths": self.prefill_lengths, "cache_length": self.cache_length}


def export_litertlm(model_dir: Path, out_dir: Path, prefill_lengths: list[int], cache_length: int,
                    quant: str = "int8", log: Path | None = None, python: str | None = None) -> LitertExport:
    """``litert-torch export_hf`` with an externalized embedder, text only; checked with peek."""
    python = python or litert_python()
    if quant not in QUANT_RECIPES:
        raise EdgekitError(f"LiteRT quantization must be one of {', '.join(QUANT_RECIPES)}, not {quant!r}.")
    if not available(python):
        raise EdgekitError(f"{python} cannot import litert_torch and litert_lm: pip install litert-torch==0.10.0 "
                           "tensorflow-cpu==2.21.0 litert-lm-api==0.18.1 (or set EDGEKIT_LITERT_PYTHON).")
    out_dir.mkdir(parents=True, exist_ok=True)
    argv = [_bin(python, "litert-torch"), "export_hf", str(model_dir), str(out_dir),
            f"--prefill_lengths=[{','.join(str(n) for n in prefill_lengths)}]", f"--cache_length={cache_length}",
            "--externalize_embedder=True", "--export_vision_encoder=False", "--export_audio_encoder=False"]
    if QUANT_RECIPES[quant]:
        argv.append(f"--quantization_recipe={QUANT_RECIPES[quant]}")
    log = log or out_dir / "export.log"
    with open(log, "wb") as fh:
        proc = subprocess.run(argv, stdout=fh, stderr=subprocess.STDOUT, check=False)
    bundle = out_dir / "model.litertlm"
    if proc.returncode != 0 or not bundle.is_file():
        tail = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()][-1:] or ["no output"]
        raise EdgekitError(f"litert-torch export_hf failed (exit {proc.returncode}): {tail[0][:300]} (log: {log}).")
    sections = peek_sections(bundle, python)
    if "TFLiteModel" not in " ".join(sections):
        raise EdgekitError(f"{bundle.name} holds no TFLite model section (sections: {', '.join(sections)}).")
    return LitertExport(bundle, sections, quant, list(prefill_lengths), cache_length)


def peek_sections(bundle: Path, python: str | None = None) -> list[str]:
    """The ``Data Type`` of each section, as ``litert-lm-peek`` lists them."""
    python = python or litert_python()
    proc = subprocess.run([_bin(python, "litert-lm-peek"), "--litertlm_file", str(bundle)], capture_output=True,
                          text=True, check=False)
    if proc.returncode != 0:
        raise EdgekitError(f"litert-lm-peek cannot read {bundle}: {(proc.stderr.strip().splitlines() or [''])[-1]}")
    return re.findall(r"Data Type:\s+(\S+)", proc.stdout)


def score_text(bundle: Path, prompt: str, continuation: str, workdir: Path,
               python: str | None = None) -> list[float]:
    """LiteRT-LM's log-prob of each token of ``continuation`` after ``prompt`` (CPU backend)."""
    python = python or litert_python()
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "home").mkdir(exist_ok=True)
    (workdir / "cache").mkdir(exist_ok=True)
    # The runtime writes under ~/.litert-lm: keep that out of the user's home.
    env = {**os.environ, "HOME": str(workdir / "home")}
    req = json.dumps({"bundle": str(bundle), "prompt": prompt, "continuation": continuation,
                      "cache_dir": str(workdir / "cache")})
    proc = subprocess.run([python, str(_SMOKE)], input=req, capture_output=True, text=True, env=env, check=False)
    if proc.returncode != 0:
        raise EdgekitError(f"LiteRT-LM could not run {bundle.name}: {(proc.stderr.strip().splitlines() or [''])[-1]}")
    return [float(x) for x in json.loads(proc.stdout.strip().splitlines()[-1])["token_scores"]]


def litert_torch_version(python: str | None = None) -> str:
    proc = subprocess.run([python or litert_python(), "-c",
                           "from importlib.metadata import version; print(version('litert-torch'))"],
                          capture_output=True, text=True, check=False)
    return proc.stdout.strip() or "unknown"


def convert_litert(model: ModelInput, info: ModelInfo, prefill_lengths: list[int], cache_length: int, quant: str,
                   store: Store, force: bool = False) -> tuple[Artifact, bool]:
    """The target as a ``.litertlm`` store artifact (kind ``litertlm``); skipped when unchanged."""
    python = litert_python()
    version = litert_torch_version(python)
    key = Store.key({"stage": "convert-litert", "version": 1, "source": model.identity, "quant": quant,
                     "prefill_lengths": list(prefill_lengths), "cache_length": cache_length,
                     "litert_torch": version})
    if not force and (art := store.get("litertlm", key)) is not None:
        return art, True
    staging = store.staging_dir()
    try:
        work = staging / "work"
        exported = export_litertlm(info.path, work, prefill_lengths, cache_length, quant, staging / "export.log",
                                   python)
        shutil.move(str(exported.path), staging / "target.litertlm")
        shutil.rmtree(work)
        manifest = {"stage": "convert-litert", "role": "target", "litertlm_file": "target.litertlm",
                    "source": model.identity, "architecture": info.architecture, "litert_torch": version,
                    **{k: v for k, v in exported.to_dict().items() if k != "path"}}
        art = store.put("litertlm", key, staging, manifest)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return art, False
