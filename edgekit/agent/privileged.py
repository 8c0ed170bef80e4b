#!/usr/bin/python3 -I
"""edgekit-root: the one program edgekit runs as root on a board whose login user has no other sudo rights.

`edgekit board setup --apply` installs this file root-owned as /usr/local/sbin/edgekit-root and a sudoers
drop-in that lets the login user run it, and nothing else, without a password. Every verb is checked here, so
what the login user can do as root is exactly this list:

    systemctl daemon-reload
    systemctl VERB [--quiet] UNIT       VERB: start stop restart enable disable is-active is-enabled reset-failed
    unit-install UNIT < unit-file       the unit file comes on stdin (root never opens a path the user names)
    unit-remove UNIT                    stop, disable and delete it
    nvpmodel -m N
    jetson_clocks [--store|--restore /var/lib/edgekit/jetson_clocks.conf]

UNIT is always ``edgekit-<name>.service``. A unit installed for a caller other than root must run as that
caller (``User=``) and may use only the keys edgekit writes; none of them makes systemd open a file as root
(no StandardOutput=append:, no EnvironmentFile=: the server opens its log and key file itself, as the user).
Refused: exit 64 and one sentence on stderr. Standard library only (Python 3.8); imports nothing of edgekit.

On a simulated board this file sits under the board's root (<root>/usr/local/sbin/edgekit-root): the root is
taken from where the file is, never from the caller's environment, and the board's own systemctl stand-in
(<root>/../bin) is used.
"""

from __future__ import annotations

import os
import pwd
import re
import subprocess
import sys

HELPER_PATH = "/usr/local/sbin/edgekit-root"
CLOCKS_FILE = "/var/lib/edgekit/jetson_clocks.conf"
UNIT_RE = re.compile(r"^edgekit-[a-z0-9][a-z0-9-]{0,62}\.service$")
SYSTEMCTL_VERBS = frozenset({"start", "stop", "restart", "enable", "disable", "is-active", "is-enabled",
                             "reset-failed"})
# The keys edgekit's units use (release/units.py), by section. Nothing here opens a path as root or runs
# anything outside the service's user.
ALLOWED_KEYS = {
    "Unit": frozenset({"Description", "After", "Wants"}),
    "Service": frozenset({"Type", "WorkingDirectory", "Environment", "ExecStart", "Restart", "RestartSec",
                          "TimeoutStopSec", "User", "StandardOutput", "StandardError"}),
    "Install": frozenset({"WantedBy"}),
}
SAFE_OUTPUT = frozenset({"journal", "null", "inherit"})
# Keys whose value could reach beyond the unit (start another unit, hook it into another target): edgekit's only.
FIXED_VALUES = {
    "After": frozenset({"network-online.target", "network.target"}),
    "Wants": frozenset({"network-online.target", "network.target"}),
    "WantedBy": frozenset({"multi-user.target"}),
    "Type": frozenset({"simple", "exec"}),
    "Restart": frozenset({"no", "on-failure", "always"}),
}
STARTING_VERBS = frozenset({"start", "restart", "enable"})
SERVER_WRITES = ("logs", "releases")  # under the base: where a server writes (its log, a release's caches)
MAX_UNIT_BYTES = 64 * 1024
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
    if not UNIT_RE.match(name):
        raise Refused(f"{name!r} is not an edgekit unit (edgekit-<name>.service)")
    return name


def check_unit(text: str, user: str) -> None:
    """A unit for ``user`` may only run as ``user``, with edgekit's keys, and open nothing as root."""
    section = ""
    users = []
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.endswith("\\"):
            raise Refused(f"line {n}: continued lines are not accepted")
        if line.startswith("["):
            section = line.strip("[]")
            if section not in ALLOWED_KEYS:
                raise Refused(f"line {n}: section [{section}] is not one edgekit writes")
            continue
        key, sep, value = line.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or key not in ALLOWED_KEYS.get(section, ()):
            raise Refused(f"line {n}: {key!r} is not a key edgekit writes in [{section}]")
        if key == "User":
            users.append(value)
        elif key == "ExecStart" and (not value or value[0] in "+!@:-"):
            raise Refused(f"line {n}: ExecStart must be a plain command (no +, !, @, :, - prefix)")
        elif key in ("StandardOutput", "StandardError") and value not in SAFE_OUTPUT:
            raise Refused(f"line {n}: {key} may only be journal, null or inherit (systemd opens files as root)")
        elif key in FIXED_VALUES and value not in FIXED_VALUES[key]:
            raise Refused(f"line {n}: {key}={value} is not one edgekit writes")
    if users != [user]:
        raise Refused(f"the unit must run as {user!r} (one User={user} line)")


def run(argv: list, root: str, stdin_text: str | None = None) -> int:
    return subprocess.run(argv, env=environment(root), input=stdin_text, text=True, check=False).returncode


def unit_install(name: str, root: str) -> int:
    data = sys.stdin.buffer.read(MAX_UNIT_BYTES + 1)
    if len(data) > MAX_UNIT_BYTES:
        raise Refused(f"the unit file is larger than {MAX_UNIT_BYTES} bytes")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise Refused("the unit file is not UTF-8") from None
    who = caller()
    if who != "root":
        check_unit(text, who)
    unit_dir = os.path.join(root, "etc/systemd/system")
    os.makedirs(unit_dir, exist_ok=True)
    tmp = os.path.join(unit_dir, f".{name}.new")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.chmod(tmp, 0o644)
    os.replace(tmp, os.path.join(unit_dir, name))
    return run(["systemctl", "daemon-reload"], root)


def unit_remove(name: str, root: str) -> int:
    run(["systemctl", "stop", name], root)
    run(["systemctl", "disable", name], root)
    path = os.path.join(root, "etc/systemd/system", name)
    if os.path.lexists(path):
        os.remove(path)
        return run(["systemctl", "daemon-reload"], root)
    return 0


def systemctl(args: list, root: str) -> int:
    if args == ["daemon-reload"]:
        return run(["systemctl", "daemon-reload"], root)
    quiet = "--quiet" in args
    rest = [a for a in args if a != "--quiet"]
    if len(rest) != 2 or rest[0] not in SYSTEMCTL_VERBS:
        raise Refused("systemctl takes daemon-reload, or one of " + ", ".join(sorted(SYSTEMCTL_VERBS))
                      + " and one unit")
    verb, name = rest[0], unit_name(rest[1])
    who = caller()
    if verb in STARTING_VERBS and who != "root":
        # What starts must be a unit this helper would install for the caller: not one an earlier edgekit left
        # running as root (its ExecStart is the user's file), nor one of that name from anywhere else.
        try:
            with open(os.path.join(root, "etc/systemd/system", name), encoding="utf-8") as fh:
                check_unit(fh.read(MAX_UNIT_BYTES), who)
        except OSError:
            raise Refused(f"{name} is not installed in /etc/systemd/system") from None
        except Refused as exc:
            raise Refused(f"the installed {name} is not one for {who} ({exc}); deploy again, which installs one "
                          "that is") from None
    return run(["systemctl", verb, *(["--quiet"] if quiet else []), name], root)


def nvpmodel(args: list, root: str) -> int:
    if len(args) != 2 or args[0] != "-m" or not re.match(r"^[0-9]{1,2}$", args[1]):
        raise Refused("nvpmodel takes -m and a mode number")
    return run(["nvpmodel", "-m", args[1]], root)


def jetson_clocks(args: list, root: str) -> int:
    if args and (len(args) != 2 or args[0] not in ("--store", "--restore") or args[1] != CLOCKS_FILE):
        raise Refused(f"jetson_clocks takes nothing, or --store/--restore {CLOCKS_FILE}")
    if args:
        os.makedirs(os.path.join(root, os.path.dirname(CLOCKS_FILE).lstrip("/")), mode=0o755, exist_ok=True)
        args = [args[0], os.path.join(root, CLOCKS_FILE.lstrip("/"))]
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
        raise Refused(f"{verb!r} is not one of its verbs (systemctl, unit-install, unit-remove, nvpmodel, "
                      "jetson_clocks)")
    except Refused as exc:
        print(f"edgekit-root refused: {exc}.", file=sys.stderr)
        return REFUSED


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
