"""`edgekit ci init`: the nightly on-device benchmark workflow, into your own repository."""

from __future__ import annotations

from pathlib import Path

import click

from edgekit.cli import json_option
from edgekit.cli.app import App


@click.group()
def ci() -> None:
    """The nightly on-device benchmark workflow (GitHub Actions, self-hosted Jetson runners)."""


@ci.command("init")
@click.option("--spec", metavar="REQUIREMENT",
              help="What the runners install: a wheel (URL or absolute path) or "
                   "'edgekit-jetson @ git+URL@<commit>'. Default: where this edgekit came from, if a repository.")
@click.option("--dir", "repo", type=click.Path(path_type=Path), default=Path("."), show_default=True,
              help="Your repository's root.")
@click.option("--force", is_flag=True, help="Replace workflow files that exist.")
@json_option
@click.pass_obj
def init(app: App, spec: str | None, repo: Path, force: bool) -> None:
    """Write .github/workflows/nightly-bench.yml and .github/actionlint.yaml, edgekit's install pinned."""
    from edgekit.ci_init import write_workflow

    written = write_workflow(repo, spec, force)
    data = {"files": written.files, "spec": written.spec}

    def human() -> None:
        for f in written.files:
            app.out.print(f"wrote {f}")
        app.out.print(f"runners install: {written.spec}")
        app.out.print("Next: register a self-hosted runner on each board (labels jetson,orin or jetson,thor), "
                      "see docs/nightly.md.")

    app.emit(data, human)
