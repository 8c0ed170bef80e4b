"""`edgekit build`: llama.cpp for a board (cross from here, or on the board), cached in the store."""

from __future__ import annotations

import shlex

import click

from edgekit.build import BuildOptions, build_key, prepare
from edgekit.build import build as run_build
from edgekit.build.targets import TARGET_NAMES
from edgekit.cli import board_option, json_option
from edgekit.cli.app import App
from edgekit.errors import EdgekitError


def _shell_lines(argv: list[str]) -> str:
    """cmake -S .. -B .. on one line, then one -D per line: readable and still pasteable."""
    head = [a for a in argv if not a.startswith("-D")]
    flags = [a for a in argv if a.startswith("-D")]
    return " \\\n    ".join([shlex.join(head), *(shlex.quote(f) for f in flags)])


def _board_line(app: App, board_name: str) -> tuple[str, str | None, str | None]:
    """(profile, CUDA, JetPack) as the board reports them: the build follows the board's JetPack line.

    A simulated board answers for the Jetson it presents, so its plan is a real Jetson's plan
    (`deploy` gives an x86 simulated board the host build to run).
    """
    from edgekit.remote.probe import probe
    from edgekit.remote.runner import runner_for

    entry = app.board(board_name)
    with runner_for(entry, board_name) as runner:
        facts = probe(runner, entry.base)
    return entry.profile, facts.cuda, facts.jetpack


@click.group(invoke_without_command=True)
@click.option("--board", "board_name", metavar="NAME",
              help="A board from the board file: its profile and the JetPack line it reports set the target.")
@click.option("--target", "target_name", metavar="|".join(TARGET_NAMES),
              help="Build for host (simulated boards), orin, thor or any board profile.")
@click.option("--cpu-only", is_flag=True, help="No CUDA backend.")
@click.option("--on-board", is_flag=True, help="Compile on the board over SSH (needs --board).")
@click.option("--src", metavar="PATH|TARBALL", help="llama.cpp source (default: git clone of the pinned ref).")
@click.option("--cuda-home", metavar="PATH|pypi",
              help="CUDA cross toolkit root, or 'pypi' for host nvcc + PyPI's aarch64 CUDA 13 wheels.")
@click.option("--bundle-cuda-libs", is_flag=True, help="Ship libcudart/libcublas with the binaries.")
@click.option("-j", "--jobs", type=click.IntRange(1), help="Parallel compile jobs (default: all cores).")
@click.option("--force", is_flag=True, help="Rebuild even when the store has this build.")
@click.option("--no-patches", is_flag=True,
              help="Build the tree as it is, without edgekit's llama.cpp patches (a --src they do not apply to); "
                   "its servers then take no per-request draft length and draft with the dense head.")
@click.option("--dry-run", is_flag=True, help="Print the cmake/nvcc invocations; build nothing.")
@json_option
@click.pass_obj
def build(app: App, board_name: str | None, target_name: str | None, cpu_only: bool, on_board: bool,
          src: str | None, cuda_home: str | None, bundle_cuda_libs: bool, jobs: int | None, force: bool,
          no_patches: bool, dry_run: bool) -> None:
    """Build llama-server, -cli, -bench, -quantize and -perplexity for a board.

    `edgekit build sysroot --board B` pulls the board's own CUDA headers and libraries instead.
    """
    if click.get_current_context().invoked_subcommand:
        return
    if board_name and target_name:
        raise EdgekitError("Give --board or --target, not both.")
    if on_board and not board_name:
        raise EdgekitError("--on-board needs --board NAME to know where to build.")
    target, cuda, jetpack = _board_line(app, board_name) if board_name else (target_name or "host", None, None)
    options = BuildOptions(target=target, cpu_only=cpu_only, src=src, on_board=on_board, cuda_home=cuda_home,
                           jobs=jobs, force=force, bundle_cuda_libs=bundle_cuda_libs, board_cuda=cuda,
                           patches=not no_patches,
                           board_jetpack=jetpack)
    plan = prepare(options, dry_run=True)
    if plan.where == "board" and not board_name and not dry_run:
        raise EdgekitError(f"{plan.notes[0][0].upper()}{plan.notes[0][1:]}; give --board NAME "
                           "(or --cuda-home PATH to a CUDA cross toolkit).")
    if dry_run:
        if plan.where == "board":
            from edgekit.build.onboard import board_plan

            plan = board_plan(plan, None, app.board(board_name).base if board_name else "~/edgekit")
        data = {"dry_run": True, "key": build_key(plan), **plan.to_dict()}

        def human_plan() -> None:
            for note in plan.notes:
                app.info(f"[yellow]{note}[/yellow]")
            lines = [f"# where: {plan.where}; store key {data['key'][:16]}"]
            if plan.source is not None:
                lines += [f"# patch {name}: {state}" for name, state in plan.source.patches.items()]
            if plan.toolchain_file:
                lines += [f"# {plan.toolchain_file}", plan.toolchain or ""]
            lines.append(_shell_lines(plan.configure))
            lines.append(shlex.join(plan.build))
            if plan.nvcc_template():
                lines += ["# nvcc per .cu object (CMake adds defines and includes):",
                          shlex.join(plan.nvcc_template())]
            click.echo("\n".join(lines))

        app.emit(data, human_plan)
        return
    for note in plan.notes:
        app.info(f"[yellow]{note}[/yellow]")
    if plan.where == "board":
        from edgekit.remote.runner import runner_for

        with runner_for(app.board(board_name), board_name) as runner:  # type: ignore[arg-type]
            result = run_build(options, console=app.console, runner=runner)
    else:
        result = run_build(options, console=app.console)
    data = result.to_dict()

    def human() -> None:
        verified = result.artifact.manifest.get("verify") or {}
        state = "up to date (cached)" if result.cached else f"built in {result.seconds:.0f} s"
        app.out.print(f"llama.cpp {result.plan.target.slug}: {state} → {result.artifact.path}")
        cubins = verified.get("cubins") or {}
        if cubins:
            archs = sorted({a for per in cubins.values() for a in per})
            app.out.print(f"  cubins: {', '.join(archs)} in {len(cubins)} file(s)")
        if verified.get("version_output"):
            app.out.print(f"  --version: {verified['version_output'].splitlines()[0]}")
        for p in result.artifact.manifest.get("patches") or []:
            app.out.print(f"  patch {p['name']}: {p['state']} (upstream: {p.get('upstream') or 'unknown'})")

    app.emit(data, human)


@build.command("sysroot")
@board_option
@click.option("--nvcc", type=click.Path(dir_okay=False, exists=True), help="Host nvcc to pair with the sysroot.")
@json_option
@click.pass_obj
def sysroot(app: App, board_name: str, nvcc: str | None) -> None:
    """Pull the board's CUDA target tree (include/, lib/) for cross builds against its JetPack."""
    from pathlib import Path

    from edgekit.build.sysroot import pull_sysroot
    from edgekit.remote.probe import probe
    from edgekit.remote.runner import runner_for

    entry = app.board(board_name)
    with runner_for(entry, board_name) as runner:
        facts = probe(runner, entry.base)
        result = pull_sysroot(runner, facts.base, board_name, facts.cuda, Path(nvcc) if nvcc else None)
    data = result.to_dict()

    def human() -> None:
        app.out.print(f"{board_name}: CUDA {result.cuda_version} target tree, {result.files} files "
                      f"({result.bytes / 1e6:.1f} MB) → {result.path}")
        app.out.print(result.note)

    app.emit(data, human)
