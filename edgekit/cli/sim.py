"""`edgekit sim up|status|down|power-cut|login-as`: simulated Jetson boards on this machine (real sshd on 127.0.0.1)."""

from __future__ import annotations

from pathlib import Path

import click
from rich.table import Table

from edgekit.cli import json_option
from edgekit.cli.app import App
from edgekit.paths import known_hosts_file, sim_dir
from edgekit.sim import boards as sim_boards

_DIR = click.option("--dir", "directory", type=click.Path(file_okay=False, path_type=Path),
                    help="Where the boards live (default: edgekit's cache, sim/).")


@click.group()
def sim() -> None:
    """Simulated Jetson boards: sshd on 127.0.0.1 with a Jetson's files and moving power sensors."""


@sim.command("up")
@click.option("--boards", "count", type=click.IntRange(1, 64), default=1, show_default=True,
              help="How many boards of this profile should run.")
@click.option("--profile", default="orin", show_default=True, help="Board profile (orin, thor, orin-nx-16gb, …).")
@click.option("--add", is_flag=True, help="Start N more boards even when N of this profile run already.")
@click.option("--jetpack", type=click.Choice(["6", "7", "7.2"]), default=None,
              help="The JetPack line the boards present (Orin: 6 or 7.2; Thor: 7 or 7.2). Default: the profile's.")
@click.option("--arch", type=click.Choice(["x86_64", "aarch64"]), default=None,
              help="aarch64: an emulated board, whose binaries run under qemu-user, so deploy sends it the "
                   "aarch64 release a Jetson gets (≈ 45× slower than native here). Default: this machine's own.")
@_DIR
@json_option
@click.pass_obj
def up(app: App, count: int, profile: str, add: bool, jetpack: str | None, arch: str | None,
       directory: Path | None) -> None:
    """Start simulated boards and write them into the board file (sim-1, sim-2, …).

    Boards already running count towards N; boards whose sshd died are started again.
    """
    targets = sim_boards.Targets(app.board_file, known_hosts_file())
    st, created, restarted = sim_boards.up(directory or sim_dir(), count, profile, targets, add=add,
                                           jetpack=jetpack, arch=arch)
    started = created + restarted
    data = sim_boards.status(st.path)
    data["started"], data["created"], data["restarted"] = started, created, restarted
    data["board_file"] = str(targets.board_file.resolve())

    def human() -> None:
        _table(app, data)
        if not started:
            app.out.print(f"All {count} {profile} board(s) were up already (use --add for more).")
        app.out.print(f"Boards are in {data['board_file']}; try: edgekit board probe --board "
                      f"{data['boards'][0]['name']}")

    app.emit(data, human)


@sim.command("status")
@_DIR
@json_option
@click.pass_obj
def status(app: App, directory: Path | None) -> None:
    """List the simulated boards with their ports, whether they run, and their power now."""
    data = sim_boards.status(directory or sim_dir())

    def human() -> None:
        if not data["boards"]:
            app.out.print(f"No simulated boards in {data['dir']}; start some with `edgekit sim up`.")
            return
        _table(app, data)

    app.emit(data, human)


@sim.command("power-cut")
@click.argument("board")
@_DIR
@json_option
@click.pass_obj
def power_cut(app: App, board: str, directory: Path | None) -> None:
    """Kill every process of simulated BOARD at once, as a power cut would; `edgekit sim up` boots it again
    (its enabled units start, as systemd starts them)."""
    killed = sim_boards.power_cut(directory or sim_dir(), board)
    app.emit({"board": board, "killed": killed},
             lambda: app.out.print(f"Cut the power of {board}: {killed} processes killed. Boot it: edgekit sim up"))


@sim.command("login-as")
@click.argument("board")
@click.argument("user")
@_DIR
@json_option
@click.pass_obj
def login_as(app: App, board: str, user: str, directory: Path | None) -> None:
    """Make simulated BOARD log in as USER, an unprivileged account of this machine (as root): its root stays
    root's, so what USER may do as root is what this machine's sudo allows — try `edgekit board setup` on it."""
    targets = sim_boards.Targets(app.board_file, known_hosts_file())
    st = sim_boards.login_as(directory or sim_dir(), board, user, targets)
    app.emit({"board": board, "user": st.user, "base": str(st.base)},
             lambda: app.out.print(f"{board} now logs in as {user} (its base {st.base} is {user}'s); next: "
                                   f"edgekit board setup --board {board}"))


@sim.command("down")
@click.option("--purge", is_flag=True, help="Also delete the boards' files (roots, logs, keys).")
@_DIR
@json_option
@click.pass_obj
def down(app: App, purge: bool, directory: Path | None) -> None:
    """Stop every process the simulated boards started and remove them from the board file.

    Without --dir: the default sim dir and every sim dir whose boards the board file names.
    """
    wanted = [directory] if directory else [sim_dir(), *sim_boards.dirs_of_board_file(app.board_file)]
    runs = [sim_boards.down(d, purge=purge) for d in dict.fromkeys(d.resolve() for d in wanted)]
    data = {"dir": runs[0]["dir"], "dirs": runs, "stopped": sorted(n for r in runs for n in r["stopped"]),
            "left": [p for r in runs for p in r["left"]]}

    def human() -> None:
        done = [r for r in runs if r["stopped"]]
        if not done:
            app.out.print(f"Stopped no boards (looked in {', '.join(r['dir'] for r in runs)}).")
        for r in done:
            app.out.print(f"Stopped {', '.join(r['stopped'])} in {r['dir']}.")

    app.emit(data, human)


def _table(app: App, data: dict) -> None:
    updater = data.get("updater") or {}
    user = data["boards"][0]["user"] if data["boards"] else ""
    table = Table(title=f"{data['dir']}\nssh {user}@127.0.0.1, power updater "
                        f"{'running' if updater.get('alive') else '[red]stopped[/red]'}")
    with_services = any(b["services"] for b in data["boards"])
    cols = ["board", "profile", "ssh", "service", "sshd", "power", *(["units"] if with_services else [])]
    for col in cols:
        table.add_column(col, no_wrap=col != "units")
    for b in data["boards"]:
        profile = b["profile"] + (f" ({b['arch']}, emulated)" if b.get("emulated") else "")
        row = [b["name"], profile, str(b["port"]), str(b["service_port"]),
               str(b["sshd_pid"]) if b["alive"] else "[red]down[/red]",
               f"{b['total_watts']:.2f} W {b['total_rail']}"]
        table.add_row(*row, *([", ".join(b["services"]) or "-"] if with_services else []))
    app.out.print(table)
