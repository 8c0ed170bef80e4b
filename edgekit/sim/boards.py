"""`sim up` / `sim down` / `sim status`: start, list and stop simulated boards in a sim dir."""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import secrets
import shutil
import stat
import subprocess
import sys
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import psutil

from edgekit.config.boardfile import Board, Boards
from edgekit.config.profiles import BoardProfile, get_profile, with_jetpack
from edgekit.errors import EdgekitError
from edgekit.sim import emulation, keys, procs, rootfs, sshd
from edgekit.sim import state as state_mod
from edgekit.sim.state import BoardState, SimState

BIN_TOOLS = {"nvpmodel": "nvpmodel", "jetson_clocks": "jetson_clocks"}  # on-board name → file
# systemctl and journalctl: small launchers of one module, bin/systemctl, compiled once by the board's
# python3. A deploy runs them several times per board, and compiling 650 lines on every call cost more
# than the call's own work.
SYSTEMD_TOOLS = ("systemctl", "journalctl")
SYSTEMD_MODULE = "_edgekit_systemd_sim"
_SYSTEM_PATH = ("/usr/local/bin", "/usr/bin", "/bin")


@dataclass
class Targets:
    """Where the boards are published: the board file and edgekit's known_hosts."""

    board_file: Path
    known_hosts: Path


def current_user() -> str:
    return pwd.getpwuid(os.geteuid()).pw_name


def board_path_env(board: BoardState) -> str:
    dirs = [str(board.bin_dir), *_SYSTEM_PATH]
    if not any(os.access(os.path.join(d, "python3"), os.X_OK) for d in _SYSTEM_PATH):
        dirs.append(os.path.dirname(sys.executable))  # the stand-ins need some python3
    return ":".join(dirs)


def board_env(board: BoardState, token: str, sim_dir: Path) -> dict[str, str]:
    """What sshd's SetEnv gives every session on the board."""
    return {
        "EDGEKIT_BOARD_ROOT": str(board.root),
        "EDGEKIT_SIM_BOARD": board.name,
        "EDGEKIT_SIM_ID": token,  # `sim down` ends every process that carries this
        "EDGEKIT_SIM_DIR": str(sim_dir),
        "PATH": board_path_env(board),
        # Debian's bash sources ~/.bashrc for ssh commands unless it is a nested shell; the
        # login user is the workstation's user, whose dotfiles (pyenv, …) are no board's and
        # cost ~0.3 s per command. SHLVL=1 makes bash treat itself as nested and skip them.
        "SHLVL": "1",
        **(emulation.board_env(board.root) if board.emulated else {}),
    }


def _board_python(board: BoardState) -> str:
    """The python3 the board's stand-ins run under (first on its PATH after its own bin dir)."""
    path = board_path_env(board).split(":", 1)[1]
    found = shutil.which("python3", path=path)
    if found is None:
        raise EdgekitError(f"No python3 in {path} for the simulated board's systemctl.")
    return found


def _install_bin(board: BoardState) -> None:
    board.bin_dir.mkdir(parents=True, exist_ok=True)
    src = resources.files("edgekit.sim") / "bin"
    for name, source in BIN_TOOLS.items():
        _executable(board.bin_dir / name, (src / source).read_bytes())
    python = _board_python(board)
    module = board.bin_dir / f"{SYSTEMD_MODULE}.py"
    module.write_bytes((src / "systemctl").read_bytes())
    subprocess.run([python, "-m", "py_compile", str(module)], check=True, capture_output=True)
    # -S: the stand-in needs the standard library only, not site-packages.
    launcher = (f"#!{python} -S\nimport sys\n\nfrom {SYSTEMD_MODULE} import main\n\nsys.exit(main(sys.argv))\n")
    for name in SYSTEMD_TOOLS:
        _executable(board.bin_dir / name, launcher.encode())
    if board.emulated:
        emulation.install_identity(board.bin_dir)


def _executable(dest: Path, data: bytes) -> None:
    dest.write_bytes(data)
    dest.chmod(dest.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


def _next_name(taken: set[str]) -> str:
    k = 1
    while f"sim-{k}" in taken:
        k += 1
    return f"sim-{k}"


def _taken_names(st: SimState, targets: Targets) -> set[str]:
    """Our boards, plus board-file entries that are not stale sim boards (whose dirs are gone)."""
    taken = set(st.boards)
    for name, b in Boards(targets.board_file).load().boards.items():
        if not (b.sim and not Path(b.base).exists()):
            taken.add(name)
    return taken


def _ports_in_use(st: SimState) -> set[int]:
    return {p for b in st.boards.values() for p in (b.port, b.service_port, b.service_port + 1)}


def _volatile_dir(token: str) -> str | None:
    """A per-sim-dir directory on /dev/shm (tmpfs) for the sensor files, where there is one."""
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK | os.X_OK):
        return str(shm / f"edgekit-sim-{os.geteuid()}-{token}")
    return None


def _board_volatile(st: SimState, name: str) -> Path | None:
    return Path(st.volatile_dir) / name if st.volatile_dir else None


def _client_key(st: SimState) -> None:
    if not st.client_key.exists():
        pub = keys.generate_ed25519(st.client_key, f"edgekit-sim@{st.path}")
        st.authorized_keys.write_text(pub + "\n")


def board_profile(board: BoardState) -> BoardProfile:
    """The board's profile on the JetPack line it presents."""
    return with_jetpack(get_profile(board.profile), board.jetpack)


def _make_root(st: SimState, board: BoardState) -> None:
    profile = board_profile(board)
    rootfs.make_root(board.root, profile, _board_volatile(st, board.name))
    if board.emulated:
        emulation.present_cuda(board.root, profile.cuda_version)


def _create_board(st: SimState, name: str, profile: str, user: str, jetpack: str | None = None,
                  arch: str | None = None) -> BoardState:
    used = _ports_in_use(st)
    port = procs.free_port(used, kind="ssh")
    service_port = procs.free_port(used | {port}, kind="service")
    bdir = st.path / name
    if bdir.exists():
        shutil.rmtree(bdir)  # left over from an earlier `up`: a new board starts clean
    (bdir / "ssh").mkdir(parents=True)
    board = BoardState(name=name, profile=profile, dir=str(bdir), port=port, service_port=service_port,
                       user=user, host_key_pub="", jetpack=jetpack, arch=arch)
    board.host_key_pub = keys.generate_ed25519(board.host_key, f"root@{name}")
    _make_root(st, board)
    board.base.mkdir()
    _install_bin(board)
    return board


def _start_board(st: SimState, board: BoardState, sshd_bin: str) -> None:
    sshd.write_config(board, st.authorized_keys, board_env(board, st.token, st.path))
    sshd.check_config(sshd_bin, board)
    launcher = emulation.launcher() if board.emulated else []
    sshd.start(sshd_bin, board, avoid=(_ports_in_use(st) | {board.service_port}) - {board.port}, launcher=launcher)


def _boot(st: SimState, board: BoardState) -> None:
    """The board's enabled units started, as systemd starts them at boot (its systemctl stand-in's ``__boot``).
    A unit that will not start is the board's problem, as on a real one: `status` and the next deploy see it."""
    subprocess.run([str(board.bin_dir / "systemctl"), "__boot"], env=board_env(board, st.token, st.path),
                   stdin=subprocess.DEVNULL, capture_output=True, timeout=300, check=False)


def power_cut(sim_dir: Path, name: str) -> int:
    """Every process of board ``name`` killed at once (SIGKILL), as a power cut ends them: its sshd and sessions,
    its services, and what they left running. `up` boots it again. Returns how many processes were killed."""
    st = state_mod.load(sim_dir.resolve())
    if st is None or name not in st.boards:
        raise EdgekitError(f"No simulated board {name!r} in {sim_dir}.")
    doomed = {p.pid: p for p in board_processes(st.boards[name])}
    for proc in _strays(st.token):
        with contextlib.suppress(psutil.Error):
            if proc.environ().get("EDGEKIT_SIM_BOARD") == name:
                doomed[proc.pid] = proc
    for proc in doomed.values():
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(list(doomed.values()), timeout=10)
    return len(doomed)


def _ensure_updater(st: SimState) -> None:
    if procs.alive(st.updater_pid, st.updater_ctime):
        return
    pkg_parent = str(Path(__file__).resolve().parents[2])  # so `-m edgekit…` works from a source tree
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (pkg_parent, env.get("PYTHONPATH")) if p)
    st.updater_pid, st.updater_ctime = procs.spawn_detached(
        [sys.executable, "-m", "edgekit.sim.power", str(st.path)], st.updater_log, env=env, cwd=st.path
    )


def engine_pythons() -> dict[str, dict[str, str]]:
    """The Pythons a sim board's engines serve with, as the board file names them: ``<x>: {python: …}``, the
    section of engine ``<x>`` (those that run in a Python of the board's), from $EDGEKIT_<X>_PYTHON, else the venv
    `.ci/install` makes next to edgekit's (``<x>-venv``: vLLM's, LiteRT's). By that convention alone: sim sits
    below the engines and cannot ask them; an engine without such a section has no use for it."""
    found = {p.name.removesuffix("-venv"): p / "bin" / "python" for p in Path(sys.prefix).glob("*-venv")
             if re.fullmatch(r"[a-z][a-z0-9_]*-venv", p.name) and (p / "bin" / "python").exists()}
    for var, value in os.environ.items():
        m = re.fullmatch(r"EDGEKIT_([A-Z][A-Z0-9_]*)_PYTHON", var)
        if m and value:
            found[m.group(1).lower()] = Path(value)
    return {section: {"python": str(path)} for section, path in sorted(found.items())}


def _publish(st: SimState, targets: Targets) -> None:
    """Write every board into the board file and pin its host key."""
    pythons = engine_pythons()
    boards = {
        name: Board(host=b.host, port=b.port, user=b.user, key=str(st.client_key), profile=b.profile,
                    base=str(b.base), service_port=b.service_port, sim=True, **pythons)
        for name, b in st.boards.items()
    }
    Boards(targets.board_file).update(add=boards)
    keys.update_known_hosts(targets.known_hosts, pin={b.known_hosts_name: b.host_key_pub for b in st.boards.values()})
    for attr, path in (("board_files", targets.board_file), ("known_hosts_files", targets.known_hosts)):
        recorded: list[str] = getattr(st, attr)
        if str(path) not in recorded:
            recorded.append(str(path))


def up(sim_dir: Path, count: int, profile: str, targets: Targets, add: bool = False,
       jetpack: str | None = None, arch: str | None = None) -> tuple[SimState, list[str], list[str]]:
    """Make sure ``count`` boards of ``profile`` run in ``sim_dir`` (``add``: start ``count`` more).

    ``jetpack``: the JetPack line the new boards present (6, 7, 7.2; None: the profile's own), and
    only boards on that line count towards ``count``.

    Boards of the dir whose sshd died are started again. Returns the state, the names of the boards
    created now and of those started again (they keep what was on them: never "fresh").
    """
    sim_dir = sim_dir.resolve()
    canonical = get_profile(profile).name
    line = with_jetpack(get_profile(profile), jetpack).jetpack  # checks that the line runs on the profile
    jetpack = None if line == get_profile(profile).jetpack else line
    arch = emulation.board_arch(arch)
    if arch is not None:
        emulation.check_available()
    targets = Targets(targets.board_file.resolve(), targets.known_hosts.resolve())
    sshd_bin = sshd.find_sshd()
    sshd.prepare_privsep()
    created: list[str] = []
    restarted: list[str] = []
    with state_mod.locked(sim_dir):
        st = state_mod.load(sim_dir)
        if st is None:
            token = secrets.token_hex(8)
            st = SimState(dir=str(sim_dir), token=token, volatile_dir=_volatile_dir(token))
        _client_key(st)
        try:
            for board in st.boards.values():
                if not procs.alive(board.sshd_pid, board.sshd_ctime):
                    # After a reboot the tmpfs part of the root is gone: write the root again.
                    _make_root(st, board)
                    _start_board(st, board, sshd_bin)
                    _boot(st, board)
                    restarted.append(board.name)
            have = sum(1 for b in st.boards.values()
                       if b.profile == canonical and b.jetpack == jetpack and b.arch == arch)
            want = count if add else max(count - have, 0)
            taken = _taken_names(st, targets)
            for _ in range(want):
                name = _next_name(taken)
                taken.add(name)
                board = _create_board(st, name, canonical, current_user(), jetpack, arch)
                try:
                    _start_board(st, board, sshd_bin)
                except EdgekitError:
                    shutil.rmtree(board.path, ignore_errors=True)
                    volatile = _board_volatile(st, name)
                    if volatile is not None:
                        shutil.rmtree(volatile, ignore_errors=True)
                    raise
                st.boards[name] = board
                created.append(name)
        finally:
            if st.boards:
                state_mod.save(st)  # what runs must be in the state, even when a later board failed
        if st.boards:
            _ensure_updater(st)
            _publish(st, targets)
            state_mod.save(st)
    return st, created, restarted


def login_as(sim_dir: Path, name: str, user: str, targets: Targets) -> BoardState:
    """Board ``name`` logs in as ``user`` from now on, an unprivileged account of this machine (root only).

    Its root stays root's, so the user cannot write unit files or start services there; its base becomes the
    user's. What the user may do as root is then only what this machine's sudo allows it (a simulated board has no
    sudo of its own): `edgekit board setup --apply` installs edgekit's helper under the board's root and a
    drop-in in this machine's /etc/sudoers.d. The sim dir's ancestors must let others in (o+x).
    """
    if os.geteuid() != 0:
        raise EdgekitError("Only root can make a simulated board log in as another user.")
    try:
        pw = pwd.getpwnam(user)
    except KeyError:
        raise EdgekitError(f"There is no user {user!r} on this machine.") from None
    sim_dir = sim_dir.resolve()
    with state_mod.locked(sim_dir):
        st = state_mod.load(sim_dir)
        if st is None or name not in st.boards:
            raise EdgekitError(f"No simulated board {name!r} in {sim_dir}.")
        board = st.boards[name]
        for d in [*reversed(board.path.parents), st.authorized_keys.parent]:
            if not d.stat().st_mode & stat.S_IXOTH:
                raise EdgekitError(f"{user} cannot reach the simulated board: {d} does not let others in (o+x).")
        st.authorized_keys.chmod(0o644)  # sshd reads it as the user
        for dirpath, _dirs, files in os.walk(board.base):
            for entry in (dirpath, *(os.path.join(dirpath, f) for f in files)):
                os.chown(entry, pw.pw_uid, pw.pw_gid, follow_symlinks=False)
        board.user = user
        procs.stop(procs.tree(board.sshd_pid or 0, board.sshd_ctime))
        _start_board(st, board, sshd.find_sshd())
        state_mod.save(st)
        _publish(st, targets)
        state_mod.save(st)
    return board


def _strays(token: str) -> list[psutil.Process]:
    """Processes started on a board of this sim dir that left its sshd's tree (setsid, nohup, …)."""
    found = []
    mine = {os.getpid(), *(p.pid for p in psutil.Process().parents())}  # never the caller's own shell
    for proc in psutil.process_iter():
        if proc.pid in mine:
            continue
        try:
            if proc.environ().get("EDGEKIT_SIM_ID") == token:
                found.append(proc)
        except psutil.Error:
            continue
    return found


def services(board: BoardState) -> dict[str, int]:
    """Running units of the board's systemctl stand-in → supervisor pid (it leads the unit's group)."""
    running = {}
    for pidfile in sorted(board.services_dir.glob("*.pid")) if board.services_dir.is_dir() else []:
        try:
            pid, start = (int(x) for x in pidfile.read_text().split()[:2])
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, ValueError, IndexError):
            continue
        if int(fields[19]) == start and fields[0] != "Z":
            running[pidfile.name[: -len(".pid")]] = pid
    return running


def board_processes(board: BoardState) -> list[psutil.Process]:
    """sshd with its sessions, and the services the board's systemctl started."""
    found = procs.tree(board.sshd_pid, board.sshd_ctime) if board.sshd_pid else []
    for pid in services(board).values():
        found += procs.tree(pid)
    return found


def _remove_power_cap(board: BoardState) -> None:
    """The cpu cgroup the board's nvpmodel stand-in made for a power mode (empty once its services stopped)."""
    try:
        procs_file = (board.root / "run/nvpmodel-sim/cgroup").read_text().strip()
        os.rmdir(os.path.dirname(procs_file))
    except OSError:
        pass  # never made, or already gone


def down(sim_dir: Path, purge: bool = False) -> dict[str, Any]:
    """Stop every process of the sim dir, unpublish its boards; ``purge`` also deletes the dir."""
    sim_dir = sim_dir.resolve()
    if not sim_dir.exists():
        return {"dir": str(sim_dir), "stopped": [], "left": []}
    with state_mod.locked(sim_dir):
        st = state_mod.load(sim_dir)
        if st is None:
            if purge:
                shutil.rmtree(sim_dir, ignore_errors=True)
            return {"dir": str(sim_dir), "stopped": [], "left": []}
        victims: list[psutil.Process] = []
        for board in st.boards.values():
            victims += board_processes(board)
        victims += _strays(st.token)
        if st.updater_pid:
            victims += procs.tree(st.updater_pid, st.updater_ctime)
        left = procs.stop(victims)
        for board in st.boards.values():
            _remove_power_cap(board)
        try:
            _unpublish(st)  # may fail on a board file the user broke: the boards are down anyway
        finally:
            state_mod.remove(sim_dir)
            if st.volatile_dir:
                shutil.rmtree(st.volatile_dir, ignore_errors=True)
    if purge:
        shutil.rmtree(sim_dir, ignore_errors=True)
    if left:
        raise EdgekitError(f"Could not stop processes {', '.join(map(str, left))} of the simulated boards.")
    return {"dir": str(sim_dir), "stopped": sorted(st.boards), "left": left}


def dirs_of_board_file(board_file: Path) -> list[Path]:
    """The sim dirs whose boards the board file names (``sim up --dir D`` puts them anywhere)."""
    if not board_file.is_file():
        return []
    found: list[Path] = []
    for name, board in Boards(board_file).load().boards.items():
        if not board.sim:
            continue
        candidate = Path(board.base).parent.parent.resolve()  # base is <sim dir>/<board>/base
        st = state_mod.load(candidate)
        if st is not None and name in st.boards and candidate not in found:
            found.append(candidate)
    return found


def _unpublish(st: SimState) -> None:
    names = set(st.boards)
    for path in map(Path, st.board_files):
        boards = Boards(path)
        if not path.exists():
            continue
        ours = [n for n, b in boards.load().boards.items()
                if n in names and b.sim and b.base == str(st.boards[n].base)]
        if ours:
            boards.update(remove=ours)
    for path in map(Path, st.known_hosts_files):
        keys.update_known_hosts(path, unpin=[b.known_hosts_name for b in st.boards.values()])


def status(sim_dir: Path) -> dict[str, Any]:
    sim_dir = sim_dir.resolve()
    st = state_mod.load(sim_dir)
    if st is None:
        return {"dir": str(sim_dir), "updater": None, "boards": []}
    rows = []
    for b in st.boards.values():
        profile = board_profile(b)
        watts = rootfs.read_power(b.root)
        rows.append({
            "name": b.name, "profile": b.profile, "jetpack": profile.jetpack, "arch": emulation.arch_of(b),
            "emulated": b.emulated, "host": b.host, "port": b.port,
            "service_port": b.service_port,
            "user": b.user, "base": str(b.base), "root": str(b.root), "sshd_pid": b.sshd_pid,
            "alive": procs.alive(b.sshd_pid, b.sshd_ctime),
            "services": sorted(services(b)),
            "total_rail": profile.total_power_rail,
            "total_watts": round(watts.get(profile.total_power_rail, 0.0), 3),
            "rails": {k: round(v, 3) for k, v in watts.items()},
        })
    return {
        "dir": str(sim_dir),
        "client_key": str(st.client_key),
        "updater": {"pid": st.updater_pid, "alive": procs.alive(st.updater_pid, st.updater_ctime)},
        "boards": rows,
    }


def sorted_boards(st: SimState) -> list[BoardState]:
    return sorted(st.boards.values(), key=lambda b: [int(x) if x.isdigit() else x for x in re.split(r"(\d+)", b.name)])
