"""LiteRT-LM bundles (``.litertlm``) of a Gemma 4 target with litert-torch's HF exporter.

litert-torch (0.10.0) pulls tensorflow-cpu, jax and torchao, so edgekit does not import it: the
exporter, ``litert-lm-peek`` and the ``litert_lm`` smoke run all run in a subprocess of the Python
that has them (``$EDGEKIT_LITERT_PYTHON``, else this interpreter). Its HF exporter imports
``tensorflow.lite.python.schema_py_generated``: install ``tensorflow-cpu==2.21.0`` next to it.

With a drafter, edgekit writes what no public exporter does: the target with LiteRT-LM's MTP verifier
signatures and the ``Gemma4AssistantForCausalLM`` drafter as a ``tf_lite_mtp_drafter`` section
(``_litert_mtp.py``, run in that Python), so ``Engine(enable_speculative_decoding=True)`` drafts.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgekit import optional
from edgekit.convert.inputs import ModelInput
from edgekit.errors import EdgekitError
from edgekit.models.validate import ModelInfo
from edgekit.store import Artifact, Store

# litert-torch quantizes to int8 unless told "none" (no recipe at all means its default, dynamic_wi8_afp32).
QUANT_RECIPES = {"int8": "dynamic_wi8_afp32", "none": "none"}
# What the LiteRT Python needs (no extra of edgekit's: litert-torch pulls tensorflow-cpu, jax and torchao).
REQUIREMENTS = ("litert-torch==0.10.0", "tensorflow-cpu==2.21.0", "litert-lm-api==0.18.1")
_MTP_WORKER = Path(__file__).with_name("_litert_mtp.py")


def litert_python() -> str:
    """``$EDGEKIT_LITERT_PYTHON``, else the LiteRT venv ``.ci/install`` derives from this venv, else this Python."""
    if os.environ.get("EDGEKIT_LITERT_PYTHON"):
        return os.environ["EDGEKIT_LITERT_PYTHON"]
    venv = Path(sys.prefix) / "litert-venv" / "bin" / "python"
    return str(venv) if venv.is_file() else sys.executable


def _bin(python: str, name: str) -> str:
    """A console script installed next to ``python`` (venvs put them side by side)."""
    candidate = Path(python).parent / name
    return str(candidate) if candidate.exists() else name


def tokenizer_override(model_dir: Path) -> str | None:
    """The checkpoint's ``tokenizer.json``, for checkpoints without a SentencePiece ``tokenizer.model``.

    litert-torch 0.10.0 fails on a ``tokenizer.json`` whose ``pre_tokenizer`` is null (edgekit's tiny
    tokenizer; any plain BPE) and silently falls back to a lossy SentencePiece copy (byte pieces as
    characters, a lone "▁" unreachable) that tokenizes differently from transformers. Shipping the
    original (an ``HF_Tokenizer_Zlib`` section) tokenizes exactly like transformers.
    """
    tj = Path(model_dir) / "tokenizer.json"
    return str(tj) if tj.is_file() and not (Path(model_dir) / "tokenizer.model").is_file() else None


def available(python: str | None = None) -> bool:
    """``python`` has litert-torch and litert-lm-api (found, not imported: an import takes seconds)."""
    return not missing_in(python or litert_python())


def missing_in(python: str) -> list[str]:
    """The distributions of REQUIREMENTS' modules that ``python`` lacks (found, not imported: tensorflow is slow)."""
    code = ("import importlib.util as u, sys\n"
            "print(' '.join(d for m, d in (('litert_torch', 'litert-torch'), ('litert_lm', 'litert-lm-api'))"
            " if u.find_spec(m) is None))")
    try:
        proc = subprocess.run([python, "-c", code], capture_output=True, text=True, check=False, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return ["litert-torch", "litert-lm-api"]
    return proc.stdout.split() if proc.returncode == 0 else ["litert-torch", "litert-lm-api"]


def missing_sentence(purpose: str, python: str | None = None, missing: list[str] | None = None) -> str:
    python = python or litert_python()
    missing = missing if missing is not None else ["litert-torch", "litert-lm-api"]
    # Another Python than edgekit's is installed into as itself; edgekit's own, the way edgekit was installed.
    prefix = None if python == sys.executable else Path(python).parent.parent
    command = optional.install_command(REQUIREMENTS, prefix=prefix, executable=python)
    return optional.sentence(missing, purpose, command, where=f" in {python}",
                             aside="EDGEKIT_LITERT_PYTHON may name another Python that has them")


def check_python(purpose: str, python: str | None = None) -> None:
    """Refuse, before anything is exported, a LiteRT Python without litert-torch or litert-lm-api."""
    python = python or litert_python()
    if missing := missing_in(python):
        raise EdgekitError(missing_sentence(purpose, python, missing))


@dataclass(frozen=True)
class LitertExport:
    path: Path
    sections: list[str]
    quant: str
    prefill_lengths: list[int]
    cache_length: int
    model_types: list[str]
    draft_steps: int | None = None  # with an MTP drafter: tokens drafted per verify pass
    mtp: dict[str, Any] | None = None  # with an MTP drafter: KV it reads, and its graph's self-check

    def to_dict(self) -> dict[str, Any]:
        return {"path": str(self.path), "sections": self.sections, "model_types": self.model_types,
                "quant": self.quant, "prefill_lengths": self.prefill_lengths, "cache_length": self.cache_length,
                "draft_steps": self.draft_steps, "mtp": self.mtp}


def export_litertlm(model_dir: Path, out_dir: Path, prefill_lengths: list[int], cache_length: int,
                    quant: str = "int8", log: Path | None = None, python: str | None = None,
                    drafter_dir: Path | None = None, draft_steps: int = 3) -> LitertExport:
    """``litert-torch export_hf`` with an externalized embedder, text only; checked with peek.

    With ``drafter_dir`` the bundle also carries the MTP drafter (``draft_steps`` tokens per round,
    fixed in the target's ``verify`` signature).
    """
    python = python or litert_python()
    if quant not in QUANT_RECIPES:
        raise EdgekitError(f"LiteRT quantization must be one of {', '.join(QUANT_RECIPES)}, not {quant!r}.")
    check_python("the LiteRT-LM export", python)
    out_dir.mkdir(parents=True, exist_ok=True)
    log = log or out_dir / "export.log"
    if drafter_dir is None:
        argv = [_bin(python, "litert-torch"), "export_hf", str(model_dir), str(out_dir),
                f"--prefill_lengths=[{','.join(str(n) for n in prefill_lengths)}]", f"--cache_length={cache_length}",
                "--externalize_embedder=True", "--export_vision_encoder=False", "--export_audio_encoder=False",
                f"--quantization_recipe={QUANT_RECIPES[quant]}"]
        if tokenizer := tokenizer_override(model_dir):
            argv.append(f"--tokenizer_path_override={tokenizer}")
        stdin = None
    else:
        argv = [python, str(_MTP_WORKER)]
        stdin = json.dumps({"target": str(model_dir), "drafter": str(drafter_dir), "out_dir": str(out_dir),
                            "prefill_lengths": list(prefill_lengths), "cache_length": cache_length,
                            "quantization_recipe": QUANT_RECIPES[quant], "draft_steps": draft_steps,
                            "tokenizer_path_override": tokenizer_override(model_dir)}).encode()
    with open(log, "wb") as fh:
        proc = subprocess.run(argv, input=stdin, stdout=fh, stderr=subprocess.STDOUT, check=False)
    bundle = out_dir / "model.litertlm"
    if proc.returncode != 0 or not bundle.is_file():
        tail = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()][-1:] or ["no output"]
        what = "litert-torch export_hf" if drafter_dir is None else "the LiteRT-LM MTP export"
        raise EdgekitError(f"{what} failed (exit {proc.returncode}): {tail[0][:300]} (log: {log}).")
    sections = peek_sections(bundle, python)
    if "TFLiteModel" not in " ".join(sections):
        raise EdgekitError(f"{bundle.name} holds no TFLite model section (sections: {', '.join(sections)}).")
    model_types = peek_model_types(bundle, python)
    if drafter_dir is not None and "tf_lite_mtp_drafter" not in model_types:
        raise EdgekitError(f"{bundle.name} has no tf_lite_mtp_drafter section (models: {', '.join(model_types)}).")
    if drafter_dir is None:
        return LitertExport(bundle, sections, quant, list(prefill_lengths), cache_length, model_types)
    facts = json.loads((out_dir / "export.json").read_text())
    mtp = {k: facts[k] for k in ("reads", "check", "kv_cache")}
    check = mtp["check"]
    if check["conversion_max_abs_diff"] > 1e-3 or check["transformers_max_abs_diff_logits"] > 1e-3:
        raise EdgekitError(f"The converted MTP drafter does not compute what transformers' drafter computes "
                           f"(max |Δ logits| {check['transformers_max_abs_diff_logits']:.3g}, conversion "
                           f"{check['conversion_max_abs_diff']:.3g}); log: {log}.")
    return LitertExport(bundle, sections, quant, list(prefill_lengths), cache_length, model_types, draft_steps, mtp)


def _peek(bundle: Path, python: str | None = None) -> str:
    python = python or litert_python()
    proc = subprocess.run([_bin(python, "litert-lm-peek"), "--litertlm_file", str(bundle)], capture_output=True,
                          text=True, check=False)
    if proc.returncode != 0:
        raise EdgekitError(f"litert-lm-peek cannot read {bundle}: {(proc.stderr.strip().splitlines() or [''])[-1]}")
    return proc.stdout


def peek_sections(bundle: Path, python: str | None = None) -> list[str]:
    """The ``Data Type`` of each section, as ``litert-lm-peek`` lists them."""
    return re.findall(r"Data Type:\s+(\S+)", _peek(bundle, python))


def peek_model_types(bundle: Path, python: str | None = None) -> list[str]:
    """The ``model_type`` of each TFLite section (``tf_lite_prefill_decode``, ``tf_lite_mtp_drafter``, …)."""
    return re.findall(r"Key: model_type, Value \(String\):\s+(\S+)", _peek(bundle, python))


def litert_torch_version(python: str | None = None) -> str:
    proc = subprocess.run([python or litert_python(), "-c",
                           "from importlib.metadata import version; print(version('litert-torch'))"],
                          capture_output=True, text=True, check=False)
    return proc.stdout.strip() or "unknown"


def convert_litert(model: ModelInput, info: ModelInfo, prefill_lengths: list[int], cache_length: int, quant: str,
                   store: Store, force: bool = False, drafter: tuple[ModelInput, ModelInfo] | None = None,
                   draft_steps: int = 3) -> tuple[Artifact, bool]:
    """The target (and its MTP drafter) as a ``.litertlm`` store artifact (kind ``litertlm``); cached."""
    python = litert_python()
    version = litert_torch_version(python)
    mtp = ({"drafter": drafter[0].identity, "draft_steps": draft_steps,
            "worker": hashlib.sha256(_MTP_WORKER.read_bytes()).hexdigest()[:16]} if drafter else None)
    key = Store.key({"stage": "convert-litert", "version": 2, "source": model.identity, "quant": quant,
                     "prefill_lengths": list(prefill_lengths), "cache_length": cache_length,
                     "litert_torch": version, **({"mtp": mtp} if mtp else {})})
    if not force and (art := store.get("litertlm", key)) is not None:
        return art, True
    staging = store.staging_dir()
    try:
        work = staging / "work"
        exported = export_litertlm(info.path, work, prefill_lengths, cache_length, quant, staging / "export.log",
                                   python, drafter[1].path if drafter else None, draft_steps)
        shutil.move(str(exported.path), staging / "target.litertlm")
        shutil.rmtree(work)
        manifest = {"stage": "convert-litert", "role": "target", "litertlm_file": "target.litertlm",
                    "source": model.identity, "architecture": info.architecture, "litert_torch": version,
                    "drafter": ({"source": drafter[0].identity, "architecture": drafter[1].architecture}
                                if drafter else None),
                    **{k: v for k, v in exported.to_dict().items() if k != "path"}}
        art = store.put("litertlm", key, staging, manifest)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return art, False
