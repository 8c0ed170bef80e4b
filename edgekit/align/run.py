"""One alignment, end to end: check, find in the store or train, measure before/after, store."""

from __future__ import annotations

import contextlib
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgekit.align import artifact, grid
from edgekit.align.checkpoint import Checkpointer
from edgekit.align.pair import check_models, load_pair, saved_dtype
from edgekit.align.prompts import load_prompts
from edgekit.align.train import StepReport, TrainConfig, TrainResult, evaluate, train
from edgekit.config.align_spec import AlignSpec
from edgekit.convert.inputs import ModelInput
from edgekit.paths import cache_dir
from edgekit.store import Artifact, Store


@dataclass(frozen=True)
class AlignJob:
    target: ModelInput
    drafter: ModelInput
    spec: AlignSpec
    k: int
    device: str = "cpu"
    threads: int | None = 1  # one thread: on a shared 2-core box, two torch threads run several times slower
    base_dir: Path | None = None  # for a relative prompt file
    assisted_prompts: int = 16  # held-out prompts measured by transformers' assisted generation (0: skip)


@dataclass
class AlignOutcome:
    artifact: Artifact
    cached: bool

    @property
    def path(self) -> Path:
        return self.artifact.path

    def to_dict(self) -> dict[str, Any]:
        m = self.artifact.manifest
        keep = ("target", "drafter_in", "data", "settings", "qat", "heldout", "heldout_ordered", "assisted", "train",
                "device", "threads", "fingerprint")
        return {"cached": self.cached, "key": self.artifact.key, "path": str(self.artifact.path),
                **{k: m[k] for k in keep if k in m}}


@contextlib.contextmanager
def _torch_threads(n: int | None) -> Iterator[None]:
    import torch

    before = torch.get_num_threads()
    if n:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def job_key(job: AlignJob) -> tuple[str, dict[str, Any]]:
    """The store key and the facts it was made from (fingerprints, prompt set, settings)."""
    prompts = load_prompts(job.spec.data, job.base_dir)
    facts = {"target_fp": artifact.weights_fingerprint(job.target.path),
             "drafter_fp": artifact.weights_fingerprint(job.drafter.path),
             "prompts": prompts, "settings": job.spec.model_dump(exclude={"data"}) | {"k": job.k}}
    return artifact.store_key(facts["target_fp"], facts["drafter_fp"], prompts.sha256, facts["settings"]), facts


def _qat_names(mode: str, drafter: Any) -> list[str]:
    if mode == "off":
        return []
    if mode == "on":
        return [n for n, p in drafter.named_parameters() if grid.eligible(p)]
    return grid.on_grid(drafter)  # auto: keep on the grid exactly what was on it


@dataclass
class _Data:
    train: list[Any]
    heldout: list[Any]
    teacher: Any  # Teacher over train
    held: Any  # Teacher over heldout
    measure_prompts: list[str]  # held-out prompts for transformers' assisted generation


def _prepare(job: AlignJob, pair: Any, prompts: Any, say: Callable[[str], None]) -> _Data:
    from edgekit.align.continuations import continuations
    from edgekit.align.teacher import Teacher

    spec = job.spec
    say(f"target continues {len(prompts.train)} training and {len(prompts.heldout)} held-out prompts "
        f"({spec.new_tokens} tokens each)")
    train_data = continuations(pair, prompts.train, spec.new_tokens, spec.sampled, spec.seed)
    held_data = continuations(pair, prompts.heldout, spec.new_tokens)
    return _Data(train_data, held_data, Teacher(pair, train_data), Teacher(pair, held_data),
                 list(prompts.heldout[: job.assisted_prompts]))


def _measure(job: AlignJob, pair: Any, drafter: Any, data: _Data) -> dict[str, Any]:
    """Replayed greedy rounds on held-out continuations with each head an engine may run (the dense head; the
    ordered head, if the drafter has one: llama.cpp with edgekit's patch 0002, vLLM, LiteRT-LM), and
    transformers' assisted generation (its own head, the ordered one where present) or None."""
    from edgekit.align.assisted import assisted_acceptance
    from edgekit.align.unroll import has_ordered_head

    out: dict[str, Any] = {"replay": evaluate(pair, drafter, data.held, job.k).summary()}
    if has_ordered_head(drafter):
        out["replay_ordered"] = evaluate(pair, drafter, data.held, job.k, head="ordered").summary()
    out["assisted"] = (assisted_acceptance(pair, drafter, data.measure_prompts, job.spec.new_tokens, job.k)
                       if data.measure_prompts else None)
    return out


def _manifest(job: AlignJob, facts: dict[str, Any], pair: Any, data: _Data, qat: tuple[list[str], list[str]],
              measured: dict[str, Any], result: TrainResult, staging: Path, seconds: float) -> dict[str, Any]:
    import torch
    import transformers

    spec, info = job.spec, pair.target_info
    return {
        "target": {"label": job.target.label, "identity": job.target.identity, "fingerprint": facts["target_fp"],
                   "architecture": info.architecture, "hidden_size": info.hidden_size, "vocab_size": info.vocab_size},
        "drafter_in": {"label": job.drafter.label, "identity": job.drafter.identity,
                       "fingerprint": facts["drafter_fp"]},
        "fingerprint": artifact.weights_fingerprint(staging),
        "data": {**facts["prompts"].to_dict(), "new_tokens": spec.new_tokens, "sampled": spec.sampled,
                 "train_sequences": len(data.train), "heldout_sequences": len(data.heldout),
                 "train_tokens": sum(len(c.tokens) for c in data.train)},
        "settings": facts["settings"],
        "qat": {"mode": spec.qat, "tensors_on_grid": len(qat[0]), "exact_q4_0_after": len(qat[1])},
        "heldout": {"method": "greedy rounds replayed along the target's held-out continuations",
                    "head": "dense (the full tied head: llama.cpp for a drafter without ordered embeddings)",
                    "before": measured["before"]["replay"],
                    "after": measured["after"]["replay"]},
        **({"heldout_ordered": {"method": "the same, with the drafter's ordered (centroid-masked) head",
                                "head": "ordered (llama.cpp with edgekit's patch 0002, vLLM, LiteRT-LM)",
                                "before": measured["before"]["replay_ordered"],
                                "after": measured["after"]["replay_ordered"]}}
           if "replay_ordered" in measured["after"] else {}),
        "assisted": {"method": "transformers generate(assistant_model=...), greedy",
                     "before": measured["before"]["assisted"], "after": measured["after"]["assisted"]},
        "train": {"seconds": round(result.seconds, 1), "resumed_from": result.resumed_from,
                  "history": result.history},
        "seconds": round(seconds, 1),
        "device": job.device, "threads": torch.get_num_threads() if job.device == "cpu" else None,
        "torch": torch.__version__, "transformers": transformers.__version__, "code": artifact.code_version(),
    }


def align(job: AlignJob, store: Store | None = None, force: bool = False,
          say: Callable[[str], None] = lambda _m: None,
          on_step: Callable[[StepReport], None] = lambda _r: None) -> AlignOutcome:
    """The aligned drafter for ``job``: from the store, or trained (resuming a checkpoint) and stored."""
    import torch

    store = store or Store()
    check_models(job.target.path, job.drafter.path)  # a mismatched pair fails before any work
    key, facts = job_key(job)
    cached = artifact.find(store, key)
    if cached is not None and not force:
        return AlignOutcome(cached, True)
    spec, t0 = job.spec, time.monotonic()
    with _torch_threads(job.threads if job.device == "cpu" else None):
        pair = load_pair(job.target.path, job.drafter.path, job.device)
        qat_names = _qat_names(spec.qat, pair.drafter)
        data = _prepare(job, pair, facts["prompts"], say)
        measured: dict[str, Any] = {}
        measured["before"] = _measure(job, pair, pair.drafter, data)
        say(f"before: held-out acceptance {measured['before']['replay']['acceptance_rate']:.1%}, "
            f"{measured['before']['replay']['tokens_per_verify']:.2f} tokens per verify pass"
            + (f" (ordered head: {measured['before']['replay_ordered']['acceptance_rate']:.1%})"
               if "replay_ordered" in measured["before"] else ""))
        cfg = TrainConfig(spec.steps, job.k, spec.lr, spec.batch_size, spec.seed, tuple(qat_names),
                          eval_every=max(10, spec.steps // 10), checkpoint_every=max(10, spec.steps // 20))
        ckpt = Checkpointer(cache_dir() / "align" / key[:24], key)
        result = train(pair, data.teacher, data.held, cfg, ckpt, on_step)
        staging = store.staging_dir()
        try:
            artifact.save_drafter(pair.drafter, saved_dtype(job.drafter.path), job.k, job.drafter.path, staging)
            # Measure what was saved (in its stored dtype), not the training copy.
            saved = type(pair.drafter).from_pretrained(staging, dtype=torch.float32)
            saved = saved.to(pair.device)
            measured["after"] = _measure(job, pair, saved, data)
            manifest = _manifest(job, facts, pair, data, (qat_names, grid.on_grid(saved)), measured, result,
                                 staging, time.monotonic() - t0)
            art = store.put(artifact.KIND, key, staging, manifest)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    ckpt.clear()
    return AlignOutcome(art, False)


__all__ = ["AlignJob", "AlignOutcome", "align", "job_key"]
