"""``edgekit convert --recipe R``: resolve and validate both models first, then convert each."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gguf import LlamaFileType

from edgekit import optional
from edgekit.convert.checkpoint_repack import repack_checkpoint
from edgekit.convert.gguf_io import GGUFFile
from edgekit.convert.gguf_stage import QUANTIZE_TYPES, Converted, convert_mmproj, convert_model, lossless_outtype
from edgekit.convert.inputs import ModelInput, resolve
from edgekit.convert.llamacpp import LlamaCpp, find_llamacpp
from edgekit.convert.repack import GGUFValues, RepackReport, SafetensorsValues, repack_gguf
from edgekit.errors import EdgekitError
from edgekit.models.safetensors import open_model
from edgekit.models.validate import ModelInfo, check_pair, inspect_model
from edgekit.prepare.needs import check as check_needs
from edgekit.store import Store

if TYPE_CHECKING:  # the recipe's pydantic models: not needed by `edgekit repack`, whose start they would delay
    from edgekit.config.recipes import ModelSource, Recipe


@dataclass
class ConvertResult:
    recipe: str
    models: list[Converted] = field(default_factory=list)
    skipped: list[dict[str, Any]] = field(default_factory=list)
    litert: list[dict[str, Any]] = field(default_factory=list)
    # what an engine's own converter made (EngineBase.converters): format → its entries (role, file, key …)
    formats: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"recipe": self.recipe, "models": [m.to_dict() for m in self.models], "skipped": self.skipped,
                "litert": self.litert, **({"formats": self.formats} if self.formats else {})}


@dataclass
class ConvertJob:
    """What a converter step gets: the recipe's models, resolved and validated (``ready``), where to put what it
    makes (``store``), and the result it adds to (which holds what the steps before it made)."""

    recipe: Recipe
    ready: list[tuple[ModelInput, ModelInfo, ModelSource]]
    store: Store
    result: ConvertResult
    force: bool = False
    say: Callable[[str], None] = lambda _m: None
    src: str | None = None  # llama.cpp's source (the GGUF converter)
    bin_dir: str | None = None  # llama.cpp's tools


Converter = Callable[[ConvertJob], None]


def _sources(recipe: Recipe) -> list[tuple[str, ModelSource]]:
    out = [("target", recipe.target)]
    if recipe.drafter is not None:
        out.append(("drafter", recipe.drafter))
    return out


def prepare_inputs(recipe: Recipe, say: Callable[[str], None] = lambda _m: None, store: Store | None = None
                   ) -> tuple[list[tuple[ModelInput, ModelInfo, ModelSource]], list[dict[str, Any]]]:
    """Every model local and validated (architecture, sizes, files), the pair checked, nothing converted.

    A drafter with an ``align`` block is replaced by its re-fit to the target (trained once, then
    taken from ``store``, the one the conversions go to), after the pair check so a mismatch fails
    before any training.
    """
    ready: list[tuple[ModelInput, ModelInfo, ModelSource]] = []
    skipped: list[dict[str, Any]] = []
    for role, source in _sources(recipe):
        if source.package is not None:
            skipped.append({"role": role, "package": source.package, "why": "ships a GGUF; used as is"})
            continue
        model = resolve(source, role, recipe.base_dir)
        ready.append((model, inspect_model(model.path, role), source))
    infos = {m.role: i for m, i, _ in ready}
    if "target" in infos and "drafter" in infos:
        check_pair(infos["target"], infos["drafter"])
    if recipe.drafter is not None and recipe.drafter.align is not None and "drafter" in infos:
        from edgekit.align.recipe import aligned_drafter  # torch: only when a recipe asks for alignment

        target = next((m for m, _, _ in ready if m.role == "target"), None)
        for i, (model, _info, source) in enumerate(ready):
            if model.role == "drafter":
                aligned = aligned_drafter(recipe, target, model, say, store)
                ready[i] = (aligned, inspect_model(aligned.path, "drafter"), source)
    return ready, skipped


def recipe_formats(recipe: Recipe) -> tuple[str, ...]:
    """The formats the recipe's ``convert`` section lists: what ``edgekit convert`` makes."""
    return tuple(f for f, on in zip(FORMATS, (recipe.convert.gguf, recipe.convert.litert), strict=True) if on)


def convert_recipe(recipe: Recipe, store: Store | None = None, src: str | None = None,
                   bin_dir: str | None = None, force: bool = False,
                   say: Callable[[str], None] = lambda _m: None,
                   formats: Collection[str] | None = None,
                   converters: Mapping[str, Converter] | None = None) -> ConvertResult:
    """The recipe's models in ``formats`` (some of ``FORMATS``, or of an engine's own ``converters``), made in
    that order, or, by default, every format its ``convert`` section lists. An engine asks for what it serves
    (llama.cpp the GGUFs, LiteRT-LM the bundle), whatever else the recipe lists; the recipe's flags do not veto
    a format asked for by name."""
    known = {**CONVERTERS, **(converters or {})}
    wanted = recipe_formats(recipe) if formats is None else tuple(dict.fromkeys(formats))
    if unknown := sorted(set(wanted) - set(known)):
        raise ValueError(f"Unknown conversion format(s) {unknown}; known: {list(known)}.")
    check_needs(recipe, wanted)  # what makes them is installed, before anything is fetched or generated
    store = store or Store()
    result = ConvertResult(recipe.name)
    ready, result.skipped = prepare_inputs(recipe, say, store)
    job = ConvertJob(recipe, ready, store, result, force, say, src, bin_dir)
    for fmt in wanted:
        known[fmt](job)
    return result


def _convert_gguf(job: ConvertJob) -> None:
    """The GGUFs llama.cpp serves: each model at its ``quant`` (the exact Q4_0 repack of QAT weights with
    ``q4_0-exact``), and the target's vision/audio projector (``convert.mmproj``)."""
    recipe, ready, store, force, say, result = job.recipe, job.ready, job.store, job.force, job.say, job.result
    need_tools = any(s.quant in QUANTIZE_TYPES for _, _, s in ready)
    llama: LlamaCpp = find_llamacpp(job.src, job.bin_dir, need_tools=need_tools)
    for model, info, source in ready:
        if source.quant == "as-is":
            raise EdgekitError(f"The {model.role} has quant 'as-is', which only fits a package source.")
        say(f"{model.role}: {info.architecture} {model.label} → {source.quant}")
        conv = convert_model(model, info, source.quant, source.fallback, llama, store, force)
        say(f"{model.role}: {'unchanged, skipped' if conv.cached else f'done in {conv.seconds:.1f} s'}"
            f" → {conv.file}")
        result.models.append(conv)
        if model.role == "target" and wants_mmproj(recipe, info):
            say("target: vision/audio projector → mmproj GGUF")
            result.models.append(convert_mmproj(model, info, llama, store, force))


def wants_mmproj(recipe: Recipe, info: ModelInfo) -> bool:
    """``convert.mmproj``: auto converts it for a target with towers; on demands the towers."""
    if recipe.convert.mmproj == "off" or (recipe.convert.mmproj == "auto" and not info.towers):
        return False
    if not info.towers:
        raise EdgekitError(f"Recipe {recipe.name} asks for an mmproj (convert.mmproj: on), but the target "
                           f"{info.path.name} has no vision or audio tower.")
    return True


def _convert_litert(job: ConvertJob) -> None:
    """The ``.litertlm`` bundle LiteRT-LM serves: the target with an MTP drafter in its own section."""
    from edgekit.convert.litert import convert_litert

    recipe, ready, store, force, say, result = job.recipe, job.ready, job.store, job.force, job.say, job.result
    spec = recipe.convert
    target = next(((m, i) for m, i, _ in ready if m.role == "target"), None)
    if target is None:
        result.skipped.append({"role": "target", "format": "litertlm", "why": "ships a GGUF only"})
        return
    # An MTP drafter travels inside the target's bundle (LiteRT-LM's tf_lite_mtp_drafter section).
    drafter = next(((m, i) for m, i, _ in ready if m.role == "drafter"), None)
    if drafter is not None and recipe.runtime.spec_type != "draft-mtp":
        result.skipped.append({"role": "drafter", "format": "litertlm",
                               "why": f"LiteRT-LM drafts with MTP drafters only, not {recipe.runtime.spec_type}"})
        drafter = None
    if towers := target[1].towers:
        result.skipped.append({"role": "target", "format": "litertlm", "why": (
            f"the bundle is text only: its {' and '.join(towers)} {'towers are' if len(towers) > 1 else 'tower is'}"
            " not exported (litert-torch 0.10 traces Gemma 4's audio adapter at a fixed (1, 204, 1536) input,"
            " the published E2B width, and its vision path at the published vision width; llama.cpp's mmproj"
            " serves images and audio)")})
    steps = recipe.runtime.draft_n_max
    say(f"target: litert-torch export → .litertlm ({spec.litert_quant}, prefill {spec.litert_prefill_lengths}, "
        f"cache {spec.litert_cache_length}{f', MTP drafter drafting {steps}' if drafter else ''})")
    art, cached = convert_litert(target[0], target[1], spec.litert_prefill_lengths, spec.litert_cache_length,
                                 spec.litert_quant, store, force, drafter, steps)
    result.litert.append({"role": "target+drafter" if drafter else "target",
                          "file": str(art.file(art.manifest["litertlm_file"])), "key": art.key, "cached": cached,
                          "sections": art.manifest["sections"], "model_types": art.manifest.get("model_types", []),
                          "draft_steps": art.manifest.get("draft_steps"),
                          "cache_length": art.manifest.get("cache_length"),
                          "chat_template": target[1].chat_template})


# The built-in formats: the GGUFs (with the mmproj) for llama.cpp; the .litertlm bundle for LiteRT-LM. An engine
# serving a format of its own brings its converter (EngineBase.converters), handed to convert_recipe.
CONVERTERS: dict[str, Converter] = {"gguf": _convert_gguf, "litertlm": _convert_litert}
FORMATS = tuple(CONVERTERS)


def repack_any(src: Path, out: Path, ref: Path | None = None, fallback: str = "Q8_0",
               llama_src: str | None = None, say: Callable[[str], None] = lambda _m: None,
               fast: bool = True) -> RepackReport:
    """``edgekit repack``: SRC is a HF model dir (bf16 safetensors) or a lossless GGUF.

    With ``--from-gguf REF`` (the converter's file, e.g. its Q8_0) metadata comes from REF and
    weights straight from SRC, so the converter does not run again; without it, a dir SRC is first
    converted to a lossless GGUF that serves as both template and source.
    """
    src, out = Path(src), Path(out)
    if not src.exists():
        raise EdgekitError(f"{src} does not exist.")
    if ref is not None and not Path(ref).is_file():
        raise EdgekitError(f"The reference GGUF {ref} does not exist.")
    if out.resolve() in {src.resolve(), Path(ref).resolve() if ref else None}:
        raise EdgekitError("OUT must be a new file, not the source or the reference.")
    if src.is_dir() and ref is None:  # llama.cpp's converter runs on it (torch, transformers)
        optional.require(f"repacking {src.name} without --from-gguf", optional.extra("convert"))
    ref_file = GGUFFile(Path(ref)) if ref is not None else None
    q8_ref = Path(ref) if ref_file is not None and ref_file.get("general.file_type") == LlamaFileType.MOSTLY_Q8_0 \
        else None
    if src.is_file():
        src_file = GGUFFile(src)
        if src_file.get("general.file_type") not in _LOSSLESS_FILE_TYPES:
            raise EdgekitError(f"{src.name} is quantized already; repack needs the checkpoint dir or a "
                               "F32/F16/BF16 GGUF as its source.")
        return repack_gguf(ref_file or src_file, GGUFValues(src_file), out, fallback, q8_reference=q8_ref)
    info = _inspect_any(src)
    llama = find_llamacpp(llama_src)
    if ref_file is not None:
        config = json.loads((src / "config.json").read_text())
        # light: the output's names come from REF; a weight with no source shows in the report.
        arch, names = llama.gguf_names(config, sorted(open_model(src)), light=True)
        if ref_file.arch != arch:
            raise EdgekitError(f"{ref} is a {ref_file.arch} file but {src.name} converts to {arch}.")
        return repack_gguf(ref_file, SafetensorsValues(src, names), out, fallback, q8_reference=q8_ref)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".repack-", dir=out.parent) as tmp:
        if fast:
            say(f"packing {src.name}'s weights straight from its safetensors; metadata from the converter")
            quick = repack_checkpoint(llama, src, info.gguf_arch, lossless_outtype(info), out, fallback, Path(tmp),
                                      Path(tmp) / "skeleton.log")
            if quick is not None:
                return quick
        template = Path(tmp) / "template.gguf"
        say(f"converting {src.name} to a lossless GGUF ({lossless_outtype(info)}) for its metadata")
        llama.convert(src, template, lossless_outtype(info), Path(tmp) / "convert.log")
        tfile = GGUFFile(template)
        report = repack_gguf(tfile, GGUFValues(tfile), out, fallback)
        report.template = f"converter --outtype {lossless_outtype(info)} (temporary)"
        report.source = f"{src} (via the lossless GGUF)"
        return report


_LOSSLESS_FILE_TYPES = (int(LlamaFileType.ALL_F32), int(LlamaFileType.MOSTLY_F16), int(LlamaFileType.MOSTLY_BF16))


def _inspect_any(path: Path) -> ModelInfo:
    """Validate a model dir as whatever role its architecture says."""
    try:
        return inspect_model(path, "drafter")
    except EdgekitError as exc:
        if "architecture" not in str(exc):
            raise
    return inspect_model(path, "target")


def verify_recipe(recipe: Recipe, store: Store | None = None, src: str | None = None, bin_dir: str | None = None,
                  ctx: int = 128, threads: int = 2, say: Callable[[str], None] = lambda _m: None) -> dict[str, Any]:
    """The recipe's converted target against transformers (and its F32 GGUF against transformers), and
    against its F32 GGUF: KL divergence and top-1 agreement on the same token windows."""
    from edgekit.convert.hfreference import write_transformers_base
    from edgekit.convert.verify import FAITHFUL, score, write_base

    check_needs(recipe, ("gguf",), reference=True)
    store = store or Store()
    converted = convert_recipe(recipe, store, src, bin_dir, say=say, formats=("gguf",))  # the GGUFs are verified
    target = next((m for m in converted.models if m.role == "target"), None)
    if target is None:
        raise EdgekitError(f"Recipe {recipe.name}'s target is not converted by edgekit; nothing to verify.")
    ready, _ = prepare_inputs(recipe, say, store)
    model, info, _source = next(r for r in ready if r[0].role == "target")
    llama = find_llamacpp(src, bin_dir, need_tools=True)
    say("target: F32 reference (the checkpoint's weights, unrounded)")
    reference = convert_model(model, info, "F32", "Q8_0", llama, store)
    assert llama.bin_dir is not None
    quant = target.artifact.manifest["quant"]
    with tempfile.TemporaryDirectory(prefix="edgekit-verify-") as tmp:
        work = Path(tmp)
        say(f"target: llama-perplexity --kl-divergence, ctx {ctx}")
        f32_base = write_base(llama.bin_dir, reference.file, work, ctx, threads)
        kld = score(llama.bin_dir, target.file, f32_base, work, str(reference.file), ctx, threads)
        say("target: the checkpoint in transformers (float32) on the same windows")
        hf_base = work / "transformers.kld"
        hf = write_transformers_base(info.path, info.architecture, f32_base, hf_base, threads)
        vs_hf = {"F32": score(llama.bin_dir, reference.file, hf_base, work, hf["reference"], ctx, threads).to_dict()}
        if quant != "F32":
            vs_hf[quant] = score(llama.bin_dir, target.file, hf_base, work, hf["reference"], ctx, threads).to_dict()
    f32 = vs_hf["F32"]
    faithful = f32["mean_kld"] <= FAITHFUL["max_mean_kld"] and f32["same_top1"] >= FAITHFUL["min_same_top1"]
    skipped = [{"role": m.role, "why": "an MTP drafter runs only inside its target"}
               for m in converted.models if m.role != "target"]
    doc = {"recipe": recipe.name, "target": {"quant": quant, **kld.to_dict()},
           "vs_transformers": {**hf, "faithful": faithful, "thresholds": FAITHFUL, "models": vs_hf},
           "skipped": skipped}
    if not faithful:
        raise EdgekitError(f"The F32 GGUF of {recipe.name}'s target does not compute what transformers computes "
                           f"from the checkpoint (mean KL {f32['mean_kld']:.4g}, top-1 agreement "
                           f"{f32['same_top1']:.1%}): the conversion or llama.cpp runs a different model.")
    return doc
