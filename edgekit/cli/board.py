"""`edgekit board probe|verify|trust|setup|key`: one board's facts, its store checked, trust of its host key, its least
privilege, its key."""

from __future__ import annotations

import contextlib
import sys

import click
from rich.table import Table

from edgekit.cli import board_option, json_option
from edgekit.cli.app import App
from edgekit.errors import EdgekitError
from edgekit.remote import agent_ship, board_setup, hostkeys
from edgekit.remote.probe import probe as probe_board
from edgekit.remote.runner import runner_for


@click.group()
def board() -> None:
    """One board: probe it, trust its host key."""


@board.command()
@board_option
@json_option
@click.pass_obj
def probe(app: App, board_name: str) -> None:
    """Read the board's L4T, CUDA, memory, disk, python, jtop and power rails over SSH."""
    entry = app.board(board_name)
    with runner_for(entry, board_name) as runner:
        facts = probe_board(runner, entry.base)
    data = facts.to_dict()
    data["profile"] = entry.profile
    data["power_rails"] = [r["label"] for r in data["power_rails"]]
    # The agent zipapps the board holds (one per edgekit version that worked on it), and whether this one's is there.
    data["agent"] = {"this": agent_ship.app().name, "held": data.pop("agents"),
                     "current": agent_ship.app().name in facts.agents}

    def human() -> None:
        table = Table(title=f"board {board_name} ({entry.user}@{entry.host}:{entry.port})", show_header=False)
        for key in ("model", "profile", "l4t", "jetpack", "cuda", "arch", "mem_total_mb", "disk_free_mb",
                    "base", "python", "jtop", "tegrastats", "nvpmodel", "power_rails", "user", "sudo"):
            value = data[key]
            table.add_row(key, ", ".join(value) if isinstance(value, list) else str(value))
        patches = data["llama_patches"]
        if data["current"]:
            table.add_row("llama.cpp patches", "none recorded (not llama.cpp, or built before edgekit's patches)"
                          if patches is None else ", ".join(p.split("\t")[0] for p in patches) or "none")
        agent = data["agent"]
        table.add_row("agent", (", ".join(agent["held"]) or "none") + (" (this edgekit's)" if agent["current"] else
                                                           f" (this edgekit's {agent['this']} is sent when needed)"))
        if entry.site:  # a site's boards serve and fetch blobs with these (apt install nginx-light aria2)
            table.add_row("site tools", ", ".join(f"{k} {'yes' if v else 'MISSING'}"
                                                  for k, v in data["site_tools"].items()))
        app.out.print(table)

    app.emit(data, human)


@board.command()
@board_option
@click.option("--repair", is_flag=True,
              help="Delete the bad blobs no current release holds, and remove the other releases that hold one.")
@json_option
@click.pass_obj
def verify(app: App, board_name: str, repair: bool) -> None:
    """Hash every blob of the board's store again (a disk that rots keeps sizes and times); exit 1 if one is bad."""
    from edgekit.remote import agent_call
    from edgekit.remote.lock import BoardLock

    entry = app.board(board_name)
    with runner_for(entry, board_name) as runner:
        facts = probe_board(runner, entry.base)
        app.info(f"{board_name}: hashing every blob of {facts.base}/store …")
        args = [facts.base, *(["--repair"] if repair else [])]
        with BoardLock(runner, facts.base, 0) if repair else contextlib.nullcontext():  # --repair: no deploy meanwhile
            data = agent_call.call(runner, facts.base, "verify-store", *args, timeout=6 * 3600,
                                   doing="Verifying the store")
    data["board"] = board_name

    def human() -> None:
        app.out.print(f"{board_name}: {data['checked']} blobs, {data['bytes'] / 1e9:.2f} GB hashed in "
                      f"{data['seconds']:.1f} s: " + (f"{len(data['bad'])} corrupt" if data["bad"] else "all good"))
        for bad in data["bad"]:
            held = ", ".join(f"{rid} ({', '.join(files)})" for rid, files in bad["releases"].items()) or "no release"
            app.out.print(f"  {bad['sha256'][:16]}… held by {held}" + ("; deleted" if bad["deleted"] else ""),
                          markup=False, highlight=False)
        if data["releases_dropped"]:
            app.out.print(f"removed releases {', '.join(data['releases_dropped'])}: the next deploy of one makes it "
                          "again from blobs sent anew", markup=False, highlight=False)
        if data["current_corrupt"]:
            app.out.print(f"the service runs release {data['current']}, which holds a corrupt file: roll back "
                          f"(`edgekit rollback --board {board_name}`), then deploy it again (the deploy hashes its "
                          "blobs again, removes it and makes it anew)", markup=False, highlight=False)
        elif data["bad"] and not repair:
            app.out.print(f"`edgekit board verify --board {board_name} --repair` deletes them; the next deploy "
                          "sends them again", markup=False, highlight=False)

    app.emit(data, human)
    if data["bad"]:
        sys.exit(1)


def group_needs() -> list[tuple[str, str]]:
    """The groups every engine's server may need of a board, with their notes (EngineBase.board_groups)."""
    from edgekit.config.engine_table import engine_names
    from edgekit.engines import get_engine

    return [need for name in engine_names() for need in get_engine(name).board_groups]


@board.command()
@board_option
@click.option("--apply", "do_apply", is_flag=True,
              help="Install the helper and the sudoers drop-in (needs root or full sudo on the board, once).")
@json_option
@click.pass_obj
def setup(app: App, board_name: str, do_apply: bool) -> None:
    """Least privilege: the sudoers drop-in that lets the login user run edgekit's root helper and nothing else."""
    entry = app.board(board_name)
    with runner_for(entry, board_name) as runner:
        facts = probe_board(runner, entry.base)
        plan = board_setup.plan(board_name, facts, group_needs())
        disabled: list[str] = []
        if do_apply:
            disabled = board_setup.apply(runner, facts, plan)
            facts = probe_board(runner, entry.base)
    data = {**plan.to_dict(), "applied": do_apply, "sudo": facts.sudo, "disabled_units": disabled}

    def human() -> None:
        if do_apply:
            app.out.print(f"board {board_name}: helper at {plan.helper}, {plan.sudoers_path} installed; "
                          f"edgekit now runs as root only through the helper (sudo: {facts.sudo}). You may now take "
                          f"{plan.user}'s other sudo rights away.")
            if disabled:
                app.out.print(f"note: {', '.join(disabled)} came from an earlier edgekit (or by hand), not from the "
                              "helper: disabled, so none starts at boot as it is (a running one runs on); deploy "
                              "again, which installs units the helper renders", markup=False, highlight=False)
            for note in plan.notes:
                app.out.print(f"note: {note}", markup=False, highlight=False)
            return
        app.out.print(f"# {plan.sudoers_path} on board {board_name} (0440 root:root), with edgekit's helper "
                      f"installed root-owned, 0755, at {plan.helper} (there now: {plan.installed}):")
        app.out.print(plan.sudoers, markup=False, highlight=False, end="")
        app.out.print(f"# `edgekit board setup --board {board_name} --apply` installs both (root or full sudo "
                      "once).", markup=False, highlight=False)
        for note in plan.notes:
            app.out.print(f"# note: {note}", markup=False, highlight=False)

    app.emit(data, human)


@board.command()
@board_option
@click.option("--yes", is_flag=True, help="Trust without asking (after checking the fingerprint yourself).")
@click.option("--fingerprint", metavar="SHA256:…", help="Trust only if the board offers this fingerprint.")
@click.option("--replace", is_flag=True, help="Replace a different key pinned earlier (board reinstalled).")
@json_option
@click.pass_obj
def trust(app: App, board_name: str, yes: bool, fingerprint: str | None, replace: bool) -> None:
    """Show the board's host-key fingerprint and pin it in edgekit's known_hosts."""
    entry = app.board(board_name)
    known_hosts = entry.known_hosts_path()
    key = hostkeys.fetch_host_key(entry.host, entry.port)
    fp = hostkeys.fingerprint(key)
    pinned = hostkeys.known_key(known_hosts, entry.host, entry.port)
    status = "new"
    if pinned is not None:
        if pinned.asbytes() == key.asbytes():
            status = "already-trusted"
        elif not replace:
            raise EdgekitError(
                f"Board {board_name!r} now offers {fp}, but {known_hosts} pins "
                f"{hostkeys.fingerprint(pinned)}; if the board was reinstalled, rerun with --replace."
            )
        else:
            status = "replaced"
    if fingerprint is not None and fingerprint != fp:
        raise EdgekitError(f"Board {board_name!r} offers {fp}, not the expected {fingerprint}; nothing trusted.")
    if status != "already-trusted":
        app.info(f"Board {board_name} ({entry.host}:{entry.port}) offers {key.get_name()} {fp}")
        if not (yes or fingerprint):
            if not sys.stdin.isatty():
                raise EdgekitError("Confirm the fingerprint with --yes or --fingerprint (no terminal to ask on).")
            click.confirm("Trust this key?", abort=True, err=True)
        hostkeys.record(known_hosts, entry.host, entry.port, key)
    app.emit(
        {"board": board_name, "fingerprint": fp, "key_type": key.get_name(), "status": status,
         "known_hosts": str(known_hosts)},
        lambda: app.out.print(f"{board_name}: {fp} {status.replace('-', ' ')} in {known_hosts}"),
    )


@board.group()
def key() -> None:
    """The API key of a board whose recipe asks for one (runtime.auth: key)."""


@key.command()
@board_option
@click.option("--wait", "wait_s", type=int, default=0, show_default=True,
              help="Seconds to wait for another deploy's lock on the board.")
@json_option
@click.pass_obj
def rotate(app: App, board_name: str, wait_s: int) -> None:
    """Replace the board's key: the server restarts on the new one, the old one is refused after."""
    from edgekit.deploy.api_key import rotate as rotate_key
    from edgekit.remote.lock import BoardLock

    entry = app.board(board_name)
    with runner_for(entry, board_name) as runner:
        facts = probe_board(runner, entry.base)
        with BoardLock(runner, facts.base, wait_s):
            done = rotate_key(runner, facts.base, board_name, sudo=facts.sudo_prefix)
    app.emit(done.to_dict(), lambda: app.out.print(
        f"{board_name}: new key in {done.key_file}; release {done.release} served again after "
        f"{done.seconds_unserved:.1f} s; the old key is refused"))
