"""`edgekit board setup`: the least a board's login user needs for edgekit — its root helper and one sudoers line.

The helper (agent/privileged.py, with its renderer agent/unitspec.py beside it) is installed root-owned where the
probe looks for it, in directories only root can change (checked on the board first: a helper in a directory the
user can write would be the user's program run as root); the user's edgekit base is fixed in the root-owned
/etc/edgekit/root-helper.json, never taken from the user's environment; the drop-in lets the login user run the
helper, and nothing else, as root without a password. Applying needs root or full sudo once (an admin's session);
after it the admin can take the user's other sudo rights away and every edgekit command still works.
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
import stat
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from edgekit.agent import privileged, unitspec
from edgekit.errors import EdgekitError
from edgekit.remote.probe import BoardFacts
from edgekit.remote.runner import LocalRunner, SshRunner

Runner = SshRunner | LocalRunner
HELPER_SOURCE = Path(privileged.__file__)
RENDERER_SOURCE = Path(unitspec.__file__)
USER_RE = re.compile(r"^[a-z_][a-z0-9_.-]{0,31}$")


@dataclass(frozen=True)
class Setup:
    board: str
    user: str
    helper: str  # where the helper goes (a simulated board's root first)
    config: str  # the root-owned file that names the user's base (the same root)
    sudoers_path: str
    sudoers: str  # the drop-in's text
    base: str
    notes: tuple[str, ...] = ()  # what the servers, run as the login user, may still lack
    installed: str = "none"  # the helper on the board: none, current (this edgekit's), outdated

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def plan(board: str, facts: BoardFacts, needs: Sequence[tuple[str, str]] = ()) -> Setup:
    user = facts.user
    if user == "root" or facts.sudo == "root":
        raise EdgekitError(f"Board {board!r}: edgekit logs in as root there, so there is nothing to narrow; give the "
                           "board file an unprivileged `user` and run this again.")
    if not USER_RE.match(user):
        raise EdgekitError(f"Board {board!r}: the login user {user!r} is not a name sudoers can take safely.")
    helper = facts.helper or privileged.HELPER_PATH
    root = helper[: -len(privileged.HELPER_PATH)] if helper.endswith(privileged.HELPER_PATH) else ""
    lines = [f"# edgekit (`edgekit board setup --apply`): {user} may run edgekit's root helper, and nothing else,",
             "# as root without a password. The helper checks every verb; it is root-owned, 0755.",
             f"{user} ALL=(root) NOPASSWD: {helper}"]
    if helper != privileged.HELPER_PATH:  # a simulated board: the helper keeps its process tags (sim down)
        keep = " ".join(privileged.SIM_ENV)
        lines.insert(2, f'Defaults!{helper} env_keep += "{keep}"')
    return Setup(board, user, helper, root + privileged.CONFIG_PATH,
                 f"/etc/sudoers.d/edgekit-{user.replace('.', '_')}", "\n".join(lines) + "\n", facts.base,
                 tuple(group_notes(user, facts, needs)),
                 "none" if not facts.helper_sha else "current" if helper_current(facts) else "outdated")


def helper_current(facts: BoardFacts) -> bool:
    """Whether the board's helper (and its renderer) are this edgekit's: an older one may refuse a verb this edgekit
    asks for, or render a unit differently."""
    return (facts.helper_sha == hashlib.sha256(HELPER_SOURCE.read_bytes()).hexdigest()
            and facts.helper_lib_sha == hashlib.sha256(RENDERER_SOURCE.read_bytes()).hexdigest())


def outdated_note(board: str, facts: BoardFacts) -> str | None:
    if facts.sudo != "helper" or helper_current(facts):
        return None
    return (f"board {board}'s edgekit-root is not this edgekit's; if a step is refused, run `edgekit board setup "
            f"--board {board} --apply` from an admin's session")


def group_notes(user: str, facts: BoardFacts, needs: Sequence[tuple[str, str]] = ()) -> list[str]:
    """The servers run as the login user, with its groups: on JetPack the GPU's device nodes are the video and
    render groups'; ``needs``: (group, note) an engine's server may need besides (its note a sentence with
    ``{user}``), said where the user lacks that group."""
    notes = []
    if facts.gpu_driver and "video" not in facts.groups:
        notes.append(f"{user} is not in the video group, whose GPU device nodes CUDA opens on JetPack: "
                     f"sudo usermod -aG video {user} (and render, where the board has that group)")
    notes += [note.format(user=user) for group, note in needs if group not in facts.groups]
    return notes


def _put(runner: Runner, path: str, data: bytes) -> None:
    if isinstance(runner, LocalRunner):
        Path(path).write_bytes(data)
        return
    with runner.sftp().open(path, "wb") as fh:
        fh.write(data)


def _run(runner: Runner, argv: list[str], what: str) -> str:
    res = runner.run(argv, check=False, timeout=120)
    if not res.ok:
        last = ((res.stderr or res.stdout).strip().splitlines() or [f"exit {res.exit_code}"])[-1]
        raise EdgekitError(f"Board {runner.name!r}: could not {what}: {last}")
    return res.stdout


def ancestors(path: str) -> list[str]:
    """Every directory above ``path``, from / down."""
    parts = [p for p in path.split("/") if p][:-1]
    return ["/", *("/" + "/".join(parts[: i + 1]) for i in range(len(parts)))]


def unsafe_directories(runner: Runner, paths: list[str]) -> list[str]:
    """Which directories above ``paths`` someone other than root can change (those that exist; the rule is the
    helper's own, privileged.unsafe_mode)."""
    dirs = sorted({d for p in paths for d in ancestors(p)})
    res = runner.run(["stat", "-L", "-c", "%u %a %n", "--", *dirs], check=False, timeout=30)
    unsafe, seen = [], set()
    for line in res.stdout.splitlines():
        uid, mode, name = line.split(" ", 2)
        seen.add(name)
        if privileged.unsafe_mode(int(uid), stat.S_IFDIR | int(mode, 8)):
            unsafe.append(f"{name} (owner uid {uid}, mode {mode})")
    # Fail closed: a directory stat said nothing of is unsafe unless stat said it does not exist (made root's).
    unsafe += [f"{d} (stat could not tell)" for d in dirs
               if d not in seen and f"'{d}': No such file or directory" not in res.stderr]
    return unsafe


def _config_text(runner: Runner, setup: Setup) -> str:
    """The helper's configuration with this user's base added (other users' kept)."""
    res = runner.run(["cat", setup.config], check=False, timeout=30)
    try:
        data = json.loads(res.stdout) if res.ok else {}
        users = dict(data.get("users") or {})
    except (ValueError, AttributeError):
        users = {}
    users[setup.user] = {"base": setup.base}
    return json.dumps({"users": users}, indent=2, sort_keys=True) + "\n"


def apply(runner: Runner, facts: BoardFacts, setup: Setup) -> list[str]:
    """Install the helper, its renderer and its configuration (the user's base), the drop-in (checked by visudo
    first), record the edgekit units already there as the user's and disable them (the helper then lets the user
    replace them, never start them as they are; those are returned), and give the base's logs and releases back to
    the login user (an earlier edgekit ran the servers as root, so what they wrote there may be root's)."""
    if facts.sudo not in ("nopasswd", "helper") or (facts.sudo == "helper" and not _full_sudo(runner)):
        raise EdgekitError(f"Board {setup.board!r}: applying needs root or passwordless sudo for {setup.user!r} "
                           "once; run it from an admin's session, or install the printed files by hand.")
    unsafe = unsafe_directories(runner, [setup.helper, setup.config])
    if unsafe:
        raise EdgekitError(f"Board {setup.board!r}: the helper would sit below {unsafe[0]}, which someone other than "
                           "root can change (so could its program, run as root); nothing was installed.")
    tmp = f"{facts.base}/.edgekit-setup-{secrets.token_hex(4)}"
    _run(runner, ["mkdir", "-p", "-m", "0700", tmp], "make a staging directory")
    try:
        _put(runner, f"{tmp}/helper", HELPER_SOURCE.read_bytes())
        _put(runner, f"{tmp}/unitspec.py", RENDERER_SOURCE.read_bytes())
        _put(runner, f"{tmp}/config", _config_text(runner, setup).encode())
        _put(runner, f"{tmp}/sudoers", setup.sudoers.encode())
        sudo = ["sudo", "-n"]
        _run(runner, [*sudo, "visudo", "-c", "-q", "-f", f"{tmp}/sudoers"], "check the sudoers drop-in (visudo)")
        for src, dst, mode in ((f"{tmp}/unitspec.py", f"{setup.helper}.d/unitspec.py", "0644"),
                               (f"{tmp}/helper", setup.helper, "0755"), (f"{tmp}/config", setup.config, "0644")):
            _run(runner, [*sudo, "install", "-D", "-o", "root", "-g", "root", "-m", mode, src, dst],
                 f"install {dst}")
        _run(runner, [*sudo, "install", "-o", "root", "-g", "root", "-m", "0440", f"{tmp}/sudoers",
                      setup.sudoers_path], f"install {setup.sudoers_path}")
        # As root itself (full sudo may run anything; without SUDO_UID the helper sees root, not the user).
        adopted = _run(runner, [*sudo, "env", "-u", "SUDO_UID", "-u", "SUDO_USER", setup.helper, "adopt",
                                setup.user], "record the edgekit units already installed")
        for top in (f"{setup.base}/{d}" for d in privileged.SERVER_WRITES):  # never more than edgekit's own dirs
            if runner.run(["test", "-d", top], check=False, timeout=30).ok:
                _run(runner, [*sudo, "chown", "-R", f"{setup.user}:", top], f"give {top} to {setup.user}")
    finally:
        runner.run(["rm", "-rf", tmp], check=False, timeout=60)
    return adopted.split()


def _full_sudo(runner: Runner) -> bool:
    return runner.run(["sudo", "-n", "true"], check=False, timeout=30).ok

