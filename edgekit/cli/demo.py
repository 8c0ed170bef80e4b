"""`edgekit demo`: the whole job on a simulated board, with no Jetson and no download.

Starts (or reuses) a simulated Orin, probes it, deploys the real Gemma 3 270M from PyPI with
n-gram speculative decoding, and prints a completion request a person can paste.
"""

from __future__ import annotations

import json
import os
import shlex

import click

from edgekit.cli import json_option
from edgekit.cli.app import App
from edgekit.engines.recipe_check import load_recipe
from edgekit.paths import known_hosts_file, sim_dir
from edgekit.remote.probe import probe
from edgekit.remote.runner import runner_for
from edgekit.sim import boards as sim_boards


@click.command()
@click.option("--recipe", "recipe_name", default="sim-gemma3-270m", show_default=True)
@click.option("--profile", default="orin", show_default=True, help="Profile of the simulated board.")
@json_option
@click.pass_obj
def demo(app: App, recipe_name: str, profile: str) -> None:
    """Simulated board up → probe → deploy → a completion you can paste (curl, or the OpenAI client)."""
    from edgekit.build import fetch_sdist
    from edgekit.deploy.pipeline import DeployOptions, check_host, deploy
    from edgekit.remote.transfer import TransferProgress

    recipe = load_recipe(recipe_name)  # bad input stops here, before anything is started
    check_host(recipe)  # and a missing extra (the sim extra's model package)
    targets = sim_boards.Targets(app.board_file, known_hosts_file())
    st, created, restarted = sim_boards.up(sim_dir(), 1, profile, targets)
    # The demo owns the simulated boards when it started every one of them: a failure stops them again.
    owned = set(st.boards) <= set(created) | set(restarted)
    canonical = next(b for b in sim_boards.sorted_boards(st))
    name = canonical.name
    try:
        board = app.board(name)
        app.info(f"[bold]1/3[/] simulated board {name} on 127.0.0.1:{board.port} (board file {app.board_file})")
        with runner_for(board, name) as runner:
            facts = probe(runner, board.base)
        app.info(f"[bold]2/3[/] probed: {facts.model}, L4T {facts.l4t} (JetPack {facts.jetpack}), CUDA {facts.cuda}, "
                 f"power rails {', '.join(r.label for r in facts.power_rails)}")
        # Offline by default: the pinned llama.cpp comes from the llama-cpp-python sdist on PyPI.
        src = os.environ.get("EDGEKIT_LLAMA_SRC") or str(fetch_sdist())
        app.info(f"[bold]3/3[/] deploying {recipe.name} (the first run builds llama.cpp: 5 to 15 min on 2 cores)")
        with TransferProgress(console=app.console) as progress:
            report = deploy(name, board, recipe, DeployOptions(src=src), app.console, progress=progress)
    except BaseException:
        _after_failure(app, owned, name)
        raise
    port = board.service_port or recipe.runtime.port
    body = json.dumps({"prompt": "The capital of France is", "n_predict": 32, "temperature": 0})
    curl = shlex.join(["curl", "-s", f"http://127.0.0.1:{port}/completion", "-H",
                       "Content-Type: application/json", "-d", body])
    # How most people talk to such a server: the OpenAI client, through the recipe's chat template.
    python = "\n".join([
        "from openai import OpenAI  # pip install openai",
        f'client = OpenAI(base_url="http://127.0.0.1:{port}/v1", api_key="none")',
        f'reply = client.chat.completions.create(model="{recipe.name}", max_tokens=32, temperature=0, '
        'messages=[{"role": "user", "content": "What is the capital of France?"}])',
        "print(reply.choices[0].message.content)"])
    data = {"board": name, "probe": facts.to_dict(), "deploy": report.to_dict(), "try": curl, "python": python}

    def human() -> None:
        app.out.print(report.headline())
        app.out.print(f"answer: {report.health.get('text', '').strip()[:200]!r}")
        app.out.print("Ask the board yourself:")
        app.out.print(curl, markup=False, highlight=False)
        app.out.print("or, from Python:")
        app.out.print(python, markup=False, highlight=False)
        app.out.print(f"Then: edgekit status --board {name}   |   edgekit sim down")

    app.emit(data, human)


def _after_failure(app: App, owned: bool, name: str) -> None:
    """A failed demo leaves nothing running that it started, and says what it left up otherwise."""
    if owned:
        sim_boards.down(sim_dir())
        app.console.print(f"[dim]demo failed: stopped the simulated board {name} it had started.[/dim]")
    else:
        app.console.print(f"[dim]demo failed: the simulated board {name} was up before the demo and is left up; "
                          "`edgekit sim down` stops it.[/dim]")
