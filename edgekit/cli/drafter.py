"""`edgekit drafter align`: re-fit a recipe's MTP drafter to the recipe's target."""

from __future__ import annotations

import click

from edgekit.cli import json_option
from edgekit.cli.app import App


@click.group()
def drafter() -> None:
    """MTP drafters: re-fit them to the target that is actually deployed."""


@drafter.command("align")
@click.option("--recipe", "-r", "recipe_name", required=True, metavar="RECIPE", help="Recipe name or path.")
@click.option("--steps", type=click.IntRange(1), default=None, help="Training steps (default: recipe, else 300).")
@click.option("--data", metavar="PROMPTS", default=None,
              help="Prompt file, one prompt per line (default: recipe, else edgekit's bundled set).")
@click.option("--seed", type=click.IntRange(0), default=None, help="Seed (default: recipe, else 0).")
@click.option("--lr", type=click.FloatRange(0, 1, min_open=True), default=None,
              help="Learning rate (default: recipe, else 1e-4; a random drafter wants ~1e-2).")
@click.option("--qat", type=click.Choice(["auto", "on", "off"]), default=None,
              help="Keep the weights on the Q4_0 grid (auto: the matrices that are on it already).")
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True)
@click.option("--threads", type=click.IntRange(1, 1024), default=1, show_default=True,
              help="Torch threads on CPU (one is fastest on a busy machine).")
@click.option("--measure-prompts", type=click.IntRange(0), default=16, show_default=True,
              help="Held-out prompts also measured with transformers' assisted generation (0: skip).")
@click.option("--force", is_flag=True, help="Train again even if the store has this aligned drafter.")
@json_option
@click.pass_obj
def align_cmd(app: App, recipe_name: str, steps: int | None, data: str | None, seed: int | None, lr: float | None,
              qat: str | None, device: str, threads: int, measure_prompts: int, force: bool) -> None:
    """Self-distil RECIPE's drafter against its target; the result is a store artifact (resumable)."""
    from edgekit.align.progress import AlignProgress
    from edgekit.align.recipe import recipe_job, recipe_spec
    from edgekit.align.run import align
    from edgekit.engines.recipe_check import load_recipe
    from edgekit.prepare.needs import check

    recipe = load_recipe(recipe_name)
    check(recipe, (), align=True)  # torch and transformers (the convert extra) before anything is fetched
    spec = recipe_spec(recipe).with_overrides(steps=steps, data=data, seed=seed, lr=lr, qat=qat)
    job = recipe_job(recipe, spec, device, threads, measure_prompts)
    with AlignProgress(app.console) as progress:
        outcome = align(job, force=force, say=app.info, on_step=progress.on_step)
    data_out = {"recipe": recipe.name, **outcome.to_dict()}
    data_out.get("train", {}).pop("history", None)

    def human() -> None:
        h = data_out["heldout"]
        before, after = h["before"], h["after"]
        app.out.print(f"aligned drafter {'(from the store) ' if outcome.cached else ''}→ {outcome.path}")
        app.out.print(f"  target {data_out['target']['label']} (fingerprint {data_out['target']['fingerprint']}), "
                      f"{spec.steps} steps, seed {spec.seed}")
        for name, s in (("before", before), ("after", after)):
            per = " ".join(f"{p:.0%}" for p in s["per_position"])
            app.out.print(f"  {name:6} held-out acceptance {s['acceptance_rate']:.1%} (per position t+1…: {per}), "
                          f"{s['tokens_per_verify']:.2f} tokens per verify pass")
        if ordered := data_out.get("heldout_ordered"):  # the head every engine serves it with
            app.out.print(f"  ordered head (llama.cpp, vLLM, LiteRT-LM): {ordered['before']['acceptance_rate']:.1%}"
                          f" → {ordered['after']['acceptance_rate']:.1%}; the numbers above are the dense head's")
        assisted = data_out.get("assisted") or {}
        if assisted.get("after"):
            app.out.print(f"  transformers assisted generation: {assisted['before']['measured_rate']:.1%} → "
                          f"{assisted['after']['measured_rate']:.1%} accepted")
        app.out.print(f"  use it: drafter: {{path: {outcome.path}}}, or give the recipe's drafter an align block")

    app.emit(data_out, human)


align_cmd.name = "align"

__all__ = ["drafter"]
