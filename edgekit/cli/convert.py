"""`edgekit convert | repack | verify`: models to GGUF, exact Q4_0 repacks, quality checks."""

from __future__ import annotations

from pathlib import Path

import click
from rich.table import Table

from edgekit.cli import json_option
from edgekit.cli.app import App

_SRC_HELP = "llama.cpp tree or tarball for the converter (default: the pinned llama-cpp-python sdist)."


@click.command()
@click.option("--recipe", "-r", required=True, help="Recipe name or path.")
@click.option("--src", default=None, metavar="PATH", help=_SRC_HELP)
@click.option("--llama-bin", default=None, metavar="DIR",
              help="Directory with llama-quantize (default: edgekit's host build).")
@click.option("--force", is_flag=True, help="Convert again even if the store has the artifact.")
@json_option
@click.pass_obj
def convert(app: App, recipe: str, src: str | None, llama_bin: str | None, force: bool) -> None:
    """Convert a recipe's target and drafter to GGUF (validated first; unchanged inputs are skipped), and to every
    other format its convert section lists or its engine serves (LiteRT-LM's .litertlm, an engine's own)."""
    from edgekit.engines import get_engine
    from edgekit.engines.recipe_check import load_recipe
    from edgekit.prepare.pipeline import convert_recipe, recipe_formats

    r = load_recipe(recipe)
    engine = get_engine(r.runtime.engine)
    formats = [*recipe_formats(r), *(f for f in engine.model_formats if f in engine.converters)]
    result = convert_recipe(r, src=src, bin_dir=llama_bin, force=force, say=app.info, formats=formats,
                            converters=engine.converters)
    data = result.to_dict()

    def human() -> None:
        table = Table()
        for col in ("role", "quant", "arch", "tensors", "size", "status", "file"):
            table.add_column(col)
        for m in data["models"]:
            status = "cached" if m["cached"] else f"{m['seconds']} s"
            if m.get("repack"):
                rp = m["repack"]
                status += f", {rp['tensors_exact']}/{rp['tensors_quantizable']} exact Q4_0"
            table.add_row(m["role"], m["quant"], m["arch"], str(m["tensors"]), _mb(m["size"]), status, m["file"])
        for lt in data["litert"]:
            table.add_row(lt["role"], "litertlm", "", "", "", "cached" if lt["cached"] else "exported", lt["file"])
        for fmt, entries in (data.get("formats") or {}).items():
            for e in entries:
                table.add_row(e.get("role", ""), fmt, "", "", _mb(e.get("size")), "cached" if e.get("cached")
                              else "made", e.get("file", ""))
        app.out.print(table)
        for m in data["models"]:
            if (m.get("head") or {}).get("note"):
                app.out.print(f"{m['role']}: {m['head']['note']}")
        for sk in data["skipped"]:
            app.out.print(f"{sk['role']}: skipped ({sk['why']})")

    app.emit(data, human)


@click.command()
@click.argument("source", type=click.Path(path_type=Path))
@click.argument("out", type=click.Path(path_type=Path))
@click.option("--from-gguf", "ref", type=click.Path(path_type=Path), default=None,
              help="The converter's GGUF of SOURCE (e.g. its Q8_0): metadata and tokenizer come from it.")
@click.option("--fallback", type=click.Choice(["Q8_0", "F16"]), default="Q8_0", show_default=True,
              help="Type for tensors that are not on a 4-bit grid.")
@click.option("--src", default=None, metavar="PATH", help=_SRC_HELP)
@click.option("--report", "report_path", type=click.Path(path_type=Path), default=None,
              help="Also write the full per-tensor JSON report here.")
@click.option("--via-lossless", is_flag=True,
              help="Convert SOURCE to a lossless GGUF first and take that as the template (the same bytes, "
                   "slower; for comparison).")
@json_option
@click.pass_obj
def repack(app: App, source: Path, out: Path, ref: Path | None, fallback: str, src: str | None,
           report_path: Path | None, via_lossless: bool) -> None:
    """Store SOURCE's QAT weights as exact Q4_0 in OUT (a HF dir of bf16 safetensors, or a bf16 GGUF)."""
    from edgekit.convert.repack import write_report
    from edgekit.prepare.pipeline import repack_any

    report = repack_any(source, out, ref, fallback, src, say=app.info, fast=not via_lossless)
    if report_path is not None:
        write_report(report, report_path)
    data = report.to_dict()
    data.pop("tensors")

    def human() -> None:
        s = data
        app.out.print(f"wrote {s['output']} ({_mb(s['size'])}, {s['size_vs_q8_0']}× the Q8_0 size"
                      f"{' (estimated)' if s['q8_0_size_is_estimate'] else ''}) in {s['seconds']} s")
        app.out.print(f"  {s['tensors_exact']} of {s['tensors_quantizable']} weight tensors exact Q4_0, "
                      f"{s['tensors_fallback']} fell back to {s['fallback']}, {s['tensors_kept']} kept as written")
        frac = s["exact_block_fraction"]
        app.out.print(f"  blocks exact: {s['exact_blocks']}/{s['blocks']}"
                      f" ({'n/a' if frac is None else f'{100 * frac:.2f}%'}), {s['bits_per_weight']} bits/weight")
        app.out.print(f"  proof: every Q4_0 tensor dequantizes to its source bit for bit: {s['proof_bit_exact']}")
        for t in s["fallback_tensors"]:
            app.out.print(f"  fallback {t['name']} → {t['type']}: {t['reason']}")

    app.emit(data, human)


def _mb(n: int | None) -> str:
    return "?" if n is None else f"{n / 1e6:.2f} MB"


@click.command()
@click.option("--recipe", "-r", required=True, help="Recipe name or path.")
@click.option("--ctx", default=128, show_default=True, help="Context of each scored window (tokens).")
@click.option("--threads", "-t", default=2, show_default=True)
@click.option("--src", default=None, metavar="PATH", help=_SRC_HELP)
@click.option("--llama-bin", default=None, metavar="DIR",
              help="Directory with llama-perplexity (default: edgekit's host build).")
@json_option
@click.pass_obj
def verify(app: App, recipe: str, ctx: int, threads: int, src: str | None, llama_bin: str | None) -> None:
    """What the recipe's conversion costs: KL divergence and top-1 agreement against the checkpoint as
    transformers runs it (F32 GGUF included) and against the F32 GGUF."""
    from edgekit.engines.recipe_check import load_recipe
    from edgekit.prepare.pipeline import verify_recipe

    data = verify_recipe(load_recipe(recipe), src=src, bin_dir=llama_bin, ctx=ctx, threads=threads, say=app.info)

    def human() -> None:
        t = data["target"]
        app.out.print(f"target {t['quant']} vs F32: mean KL divergence {t['mean_kld']:.6f} ± {t['mean_kld_err']:.6f}, "
                      f"top-1 agreement {100 * t['same_top1']:.2f}% ({t['chunks']} windows of {t['ctx']} tokens)")
        if t.get("ppl") is not None:
            app.out.print(f"  perplexity {t['ppl']:.4f} vs {t['ppl_base']:.4f}")
        hf = data["vs_transformers"]
        for quant, r in hf["models"].items():
            app.out.print(f"target {quant} vs the checkpoint in transformers: mean KL divergence {r['mean_kld']:.6f}, "
                          f"top-1 agreement {100 * r['same_top1']:.2f}%")
        bar = hf["thresholds"]
        app.out.print(f"  the F32 GGUF computes what transformers computes: {hf['faithful']} "
                      f"(mean KL ≤ {bar['max_mean_kld']:g}, top-1 ≥ {bar['min_same_top1']:.0%})")
        for s in data["skipped"]:
            app.out.print(f"  {s['role']} not measured: {s['why']}")

    app.emit(data, human)
