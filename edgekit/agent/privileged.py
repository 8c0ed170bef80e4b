#!/usr/bin/python3 -IS
"""edgekit-root: the one program edgekit runs as root on a board whose login user has no other sudo rights.

`edgekit board setup --apply` installs this file root-owned as /usr/local/sbin/edgekit-root, a root-owned
/etc/edgekit/root-helper.json that names each login user's edgekit base, and a sudoers drop-in that lets the
login user run this file, and nothing else, without a password. What the login user can do as root is exactly:

    systemctl daemon-reload
    systemctl VERB [--quiet] UNIT       VERB: start stop restart enable disable is-active is-enabled reset-failed
    unit-install UNIT < spec.json       a unit rendered here from a typed spec (unitspec.py), never unit text
    unit-remove UNIT                    stop, disable and delete it
    nvpmodel -m N
    jetson_clocks [--store|--restore /var/lib/edgekit/jetson_clocks.conf]
    adopt USER                          (root only) units an earlier helper installed, recorded as USER's

UNIT is always ``edgekit-<name>.service``. The helper never accepts unit text: systemd reads text differently from
any parser of ours (it unquotes and C-unescapes ExecStart's first word before it reads the ``+`` prefix, it ignores
a section whose header is not exactly known, a NUL ends its line). It takes the spec, checks every value (printable
only, paths under the caller's base, the caller as the unit's user) and renders the unit itself with unitspec.py's
one renderer, the same that writes the units of full-sudo and root boards. Each unit it installs is recorded as the
caller's (/var/lib/edgekit/units/UNIT.json, with the rendered text's sha256): a caller may stop, disable, remove or
overwrite only its own units, and start only a unit whose file is still the text this helper wrote for it.
Refused: exit 64 and one sentence on stderr. Standard library only (Python 3.8); imports nothing of edgekit.

On a simulated board this file sits under the board's root (<root>/usr/local/sbin/edgekit-root): the root is
taken from where the file is, never from the caller's environment, and the board's own systemctl stand-in
(<root>/../bin) is used.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import pwd
import re
import stat
import subprocess
import sys


def unsafe_mode(uid: int, mode: int) -> bool:
    """A file or directory someone other than root can change: not root's, or group/other-writable (a sticky
    directory such as /tmp excepted: nobody renames what root put there)."""
    return uid != 0 or (bool(mode & 0o022) and not (stat.S_ISDIR(mode) and mode & stat.S_ISVTX))


def untrusted(path: str) -> str | None:
    """Why root cannot trust ``path`` (it, or a directory above it, can be changed by someone else), or None."""
    here = os.path.realpath(path)
    while True:
        st = os.lstat(here)
        if unsafe_mode(st.st_uid, st.st_mode):
            return f"{here} can be changed by someone other than root (owner uid {st.st_uid}, mode {st.st_mode:o})"
        if here == "/":
            return None
        here = os.path.dirname(here)


try:  # in the package (the agent, the workstation)
    from . import unitspec
except ImportError:  # installed alone as edgekit-root: its renderer sits beside it, root-owned (board setup)
    _LIB = os.path.realpath(__file__) + ".d"
    _WHY = untrusted(os.path.join(_LIB, "unitspec.py")) if os.path.isfile(os.path.join(_LIB, "unitspec.py")) \
        else f"{_LIB}/unitspec.py is missing"
    if _WHY:  # checked before it is imported: root runs what is there
        print(f"edgekit-root refused: it will not run: {_WHY}; run `edgekit board setup --apply`.", file=sys.stderr)
        sys.exit(64)
    sys.path.insert(0, _LIB)
    import unitspec  # type: ignore[no-redef]

HELPER_PATH = "/usr/local/sbin/edgekit-root"
HELPER_LIB = HELPER_PATH + ".d"  # unitspec.py, beside the helper
CONFIG_PATH = "/etc/edgekit/root-helper.json"  # {"users": {USER: {"base": BASE}}}, written by board setup
OWNERS_DIR = "/var/lib/edgekit/units"  # UNIT.json: {"user": ..., "sha256": ...} for each unit installed here
CLOCKS_FILE = "/var/lib/edgekit/jetson_clocks.conf"
UNIT_RE = re.compile(r"edgekit-[a-z0-9][a-z0-9-]{0,62}\.service")
USER_RE = unitspec.USER_RE
SYSTEMCTL_VERBS = frozenset({"start", "stop", "restart", "enable", "disable", "is-active", "is-enabled",
                             "reset-failed"})
STARTING_VERBS = frozenset({"start", "restart", "enable"})
READING_VERBS = frozenset({"is-active", "is-enabled"})
SERVER_WRITES = ("logs", "releases")  # under the base: where a server writes (its log, a release's caches)
MAX_SPEC_BYTES = 256 * 1024
REFUSED = 64
SIM_ENV = ("EDGEKIT_SIM_BOARD", "EDGEKIT_SIM_ID", "EDGEKIT_SIM_DIR")  # sudo keeps them for a sim (see setup)


class Refused(Exception):
    pass


def prefix_for_this_user() -> list:
    """What the calling (unprivileged) side on the board puts before a root command: nothing as root; this helper
    through sudo where it is installed and the user may run it; else full ``sudo -n`` (as the probe decides)."""
    if os.getuid() == 0:
        return []
    helper = os.environ.get("EDGEKIT_BOARD_ROOT", "") + HELPER_PATH
    may = os.access(helper, os.X_OK) and subprocess.call(["sudo", "-n", "-l", helper], stdout=subprocess.DEVNULL,
                                                         stderr=subprocess.DEVNULL) == 0
    return ["sudo", "-n", helper] if may else ["sudo", "-n"]


def board_root() -> str:
    """"/" on a real board; a simulated board's root when this file is installed under one."""
    here = os.path.realpath(os.path.abspath(__file__))
    if not here.endswith(HELPER_PATH):
        return "/"
    return here[: -len(HELPER_PATH)] or "/"


def at(root: str, path: str) -> str:
    return os.path.join(root, path.lstrip("/"))


def environment(root: str) -> dict:
    """A fixed environment: sudo reset the caller's, and nothing of it is trusted but a sim's process tags."""
    path = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    env = {"PATH": path, "LANG": "C.UTF-8"}
    if root != "/":
        env["PATH"] = os.path.join(os.path.dirname(root), "bin") + ":" + path
        env["EDGEKIT_BOARD_ROOT"] = root
        env.update({k: os.environ[k] for k in SIM_ENV if k in os.environ})
    return env


def caller() -> str:
    """Who asked: the sudo caller, or root itself."""
    uid = os.environ.get("SUDO_UID") if os.getuid() == 0 else str(os.getuid())
    if uid is None or not uid.isdigit():
        return "root"
    return pwd.getpwuid(int(uid)).pw_name


def unit_name(name: str) -> str:
    if not UNIT_RE.fullmatch(name):
        raise Refused(f"{name!r} is not an edgekit unit (edgekit-<name>.service)")
    return name


def caller_base(root: str, who: str) -> str:
    """The base `board setup` recorded for ``who`` in the root-owned configuration (never the caller's word)."""
    path = at(root, CONFIG_PATH)
    try:
        why = untrusted(path)
        with open(path, encoding="utf-8") as fh:
            base = json.load(fh)["users"][who]["base"]
    except (OSError, ValueError, KeyError, TypeError):
        raise Refused(f"{CONFIG_PATH} names no edgekit base for {who}; run `edgekit board setup --apply`") from None
    if why:
        raise Refused(f"{CONFIG_PATH} is not root's alone ({why})")
    return str(base)


# ---------------------------------------------------------------- who installed what

def _owner_file(root: str, name: str) -> str:
    return os.path.join(at(root, OWNERS_DIR), name + ".json")


def owner(root: str, name: str) -> dict:
    try:
        with open(_owner_file(root, name), encoding="utf-8") as fh:
            rec = json.load(fh)
        return rec if isinstance(rec, dict) else {}
    except (OSError, ValueError):
        return {}


def record_owner(root: str, name: str, user: str, sha256: str | None) -> None:
    trusted_dir(root, OWNERS_DIR)
    write_file(_owner_file(root, name), json.dumps({"user": user, "sha256": sha256}) + "\n")


def owners_locked(root: str) -> int:
    """The owner records' lock (flock), held while one verb checks and changes them: no two installs interleave."""
    fd = os.open(os.path.join(trusted_dir(root, OWNERS_DIR), ".lock"), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def installed_sha(root: str, name: str) -> str | None:
    """The sha256 of the unit file, or None when there is none (a symlink counts as one: its sha is its own)."""
    path = os.path.join(at(root, "etc/systemd/system"), name)
    if os.path.islink(path):
        return "symlink:" + os.readlink(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as fh:
        return hashlib.sha256(fh.read()).hexdigest()


def trusted_dir(root: str, path: str) -> str:
    """A directory root writes in (made if missing), refused when someone else can change it or a directory above."""
    full = at(root, path)
    os.makedirs(full, mode=0o755, exist_ok=True)
    why = untrusted(full)
    if why:
        raise Refused(f"it will not write in {path}: {why}")
    return full


def require_owner(root: str, name: str, who: str, starting: bool = False) -> None:
    """``who`` may act on ``name`` only if this helper installed it for them (and, to start it, only while its file
    is the text the helper wrote)."""
    if who == "root":
        return
    rec = owner(root, name)
    if rec.get("user") != who:  # no record (not installed here), or another user's
        raise Refused(f"{name} was not installed by edgekit-root for {who}")
    if starting and (rec.get("sha256") is None or installed_sha(root, name) != rec.get("sha256")):
        raise Refused(f"the installed {name} is not the unit edgekit-root rendered for {who}; deploy again, which "
                      "installs one that is")


# ---------------------------------------------------------------- the verbs

def write_file(path: str, text: str) -> None:
    """``text`` at ``path``, root's, 0644, replaced with one rename (no symlink followed)."""
    tmp = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.new")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def run(argv: list, root: str) -> int:
    # No stdin: nothing run as root reads the caller's answers (nvpmodel asks whether to reboot on some modes).
    return subprocess.run(argv, env=environment(root), stdin=subprocess.DEVNULL, check=False).returncode


def read_spec(name: str) -> dict:
    data = sys.stdin.buffer.read(MAX_SPEC_BYTES + 1)
    if len(data) > MAX_SPEC_BYTES:
        raise Refused(f"the unit spec is larger than {MAX_SPEC_BYTES} bytes")
    try:
        spec = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise Refused("the unit spec is not JSON (the helper takes a spec, never unit text)") from None
    if not isinstance(spec, dict) or spec.get("unit") != name:
        raise Refused(f"the unit spec is not one for {name}")
    return spec


def unit_install(name: str, root: str) -> int:
    spec, who = read_spec(name), caller()
    try:
        text = unitspec.render(unitspec.check(spec, who, None if who == "root" else caller_base(root, who)))
    except unitspec.BadSpec as exc:
        raise Refused(str(exc)) from None
    unit_dir = trusted_dir(root, "/etc/systemd/system")
    lock = owners_locked(root)
    try:
        # Replacing a unit, or a name another user's record holds: only the caller's own.
        if installed_sha(root, name) is not None or owner(root, name).get("user") not in (None, who):
            require_owner(root, name, who)
        record_owner(root, name, who, hashlib.sha256(text.encode("utf-8")).hexdigest())
        write_file(os.path.join(unit_dir, name), text)
    finally:
        os.close(lock)
    return run(["systemctl", "daemon-reload"], root)


def unit_remove(name: str, root: str) -> int:
    path = os.path.join(at(root, "etc/systemd/system"), name)
    if not os.path.lexists(path):
        return 0
    lock = owners_locked(root)
    try:
        require_owner(root, name, caller())
        run(["systemctl", "stop", name], root)
        run(["systemctl", "disable", name], root)
        os.remove(path)
        if os.path.lexists(_owner_file(root, name)):
            os.remove(_owner_file(root, name))
    finally:
        os.close(lock)
    return run(["systemctl", "daemon-reload"], root)


def systemctl(args: list, root: str) -> int:
    if args == ["daemon-reload"]:
        return run(["systemctl", "daemon-reload"], root)
    quiet = "--quiet" in args
    rest = [a for a in args if a != "--quiet"]
    if len(rest) != 2 or rest[0] not in SYSTEMCTL_VERBS:
        raise Refused("systemctl takes daemon-reload, or one of " + ", ".join(sorted(SYSTEMCTL_VERBS))
                      + " and one unit")
    verb, name = rest[0], unit_name(rest[1])
    if verb not in READING_VERBS:
        require_owner(root, name, caller(), starting=verb in STARTING_VERBS)
    return run(["systemctl", verb, *(["--quiet"] if quiet else []), name], root)


def adopt(args: list, root: str) -> int:
    """Root only (board setup): the edgekit units an earlier helper (or edgekit) installed, recorded as USER's, so
    the user may stop, remove and replace them, and disabled: their text was not rendered here, so none of them
    starts at boot again (one that runs keeps running until the next deploy replaces it). Prints each one."""
    if caller() != "root" or len(args) != 1 or not USER_RE.fullmatch(args[0]):
        raise Refused("adopt is root's, and takes one user name")
    unit_dir = at(root, "etc/systemd/system")
    for name in sorted(os.listdir(unit_dir)) if os.path.isdir(unit_dir) else []:
        if UNIT_RE.fullmatch(name) and not owner(root, name):
            run(["systemctl", "disable", "--quiet", name], root)
            record_owner(root, name, args[0], None)
            print(name)
    return 0


def nvpmodel(args: list, root: str) -> int:
    if len(args) != 2 or args[0] != "-m" or not re.fullmatch(r"[0-9]{1,2}", args[1]):
        raise Refused("nvpmodel takes -m and a mode number")
    return run(["nvpmodel", "-m", args[1]], root)


def jetson_clocks(args: list, root: str) -> int:
    if args and (len(args) != 2 or args[0] not in ("--store", "--restore") or args[1] != CLOCKS_FILE):
        raise Refused(f"jetson_clocks takes nothing, or --store/--restore {CLOCKS_FILE}")
    if args:
        trusted_dir(root, os.path.dirname(CLOCKS_FILE))  # root reads paths from that file on --restore
        args = [args[0], at(root, CLOCKS_FILE)]
    return run(["jetson_clocks", *args], root)


def main(argv: list) -> int:
    root = board_root()
    try:
        if os.getuid() != 0:
            raise Refused("it runs as root, through sudo")
        if not argv:
            raise Refused("no verb")
        verb, args = argv[0], argv[1:]
        if verb == "systemctl":
            return systemctl(args, root)
        if verb == "unit-install" and len(args) == 1:
            return unit_install(unit_name(args[0]), root)
        if verb == "unit-remove" and len(args) == 1:
            return unit_remove(unit_name(args[0]), root)
        if verb == "nvpmodel":
            return nvpmodel(args, root)
        if verb == "jetson_clocks":
            return jetson_clocks(args, root)
        if verb == "adopt":
            return adopt(args, root)
        raise Refused(f"{verb!r} is not one of its verbs (systemctl, unit-install, unit-remove, nvpmodel, "
                      "jetson_clocks, adopt)")
    except Refused as exc:
        print(f"edgekit-root refused: {exc}.", file=sys.stderr)
        return REFUSED


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
