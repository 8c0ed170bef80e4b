"""A systemd unit from a typed spec: every value checked, then rendered by the one function that writes edgekit's
units — on the workstation (to show them), in the agent (root and full-sudo boards) and in the root helper.

A spec (JSON; a release carries one per unit in ``units.json``):

    {"unit": "edgekit-serve.service", "role": "server", "base": "/home/nvidia/edgekit", "release": "<id>",
     "argv": ["<base>/releases/<id>/bin/llama-server", "--port", "8080", ...],
     "env": {"GGML_X": "1"}, "log": "<base>/logs/server.log", "env_file": null, "key_file": null,
     "restart": "on-failure", "user": "nvidia", "hardening": "default", "writable": []}

The unit always runs the release's agent (``python3 -B <release>/agent/edgekit_agent.py exec …``), which opens
the log and reads the environment file as the unit's user, checks the key file, and becomes ``argv``: so systemd
opens no file for it as root, and ExecStart's first word is never a value from the spec (systemd reads the ``+``,
``!`` and ``@`` prefixes of that word after unquoting it). Values are refused, not escaped, when they hold a
character that is not printable (a newline would start a new line of the unit; systemd ends a line at a NUL).
Standard library only (Python 3.8); the helper imports this file from beside itself.
"""

from __future__ import annotations

import os
import re

USER_RE = re.compile(r"[a-z_][a-z0-9_.-]{0,31}")
UNIT_RE = re.compile(r"edgekit-[a-z0-9][a-z0-9-]{0,62}\.service")
RELEASE_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
PLAIN_WORD = re.compile(r"[A-Za-z0-9_/.,:=+-]+")  # needs no quotes in ExecStart (never its first word)
ROLES = {"server": "server", "candidate": "candidate server", "watchdog": "watchdog", "bench": "bench server"}
RESTART = ("no", "on-failure", "always")
HARDENING = ("default", "strict", "off")
KEYS = frozenset({"unit", "role", "base", "release", "argv", "env", "log", "env_file", "key_file", "restart",
                  "user", "hardening", "writable"})
MAX_ARGS, MAX_VALUE = 512, 4096

# The sandbox every unit gets unless the recipe says `hardening: off`: nothing here can take a Jetson's GPU away
# (its device nodes stay: no PrivateDevices=, no DevicePolicy=, no ProtectClock=, which implies a DeviceAllow=).
DEFAULT_HARDENING = (
    "NoNewPrivileges=yes", "PrivateTmp=yes", "ProtectKernelTunables=yes", "ProtectKernelModules=yes",
    "ProtectKernelLogs=yes", "ProtectControlGroups=yes", "ProtectHostname=yes", "RestrictSUIDSGID=yes",
    "RestrictRealtime=yes", "LockPersonality=yes", "CapabilityBoundingSet=", "AmbientCapabilities=",
    "KeyringMode=private", "SystemCallArchitectures=native", "UMask=0077",
)
# `hardening: strict` adds the file system, address family and system call limits, until a board proves them.
STRICT_HARDENING = (
    "ProtectSystem=strict", "ProtectHome=read-only", "RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6 AF_NETLINK",
    "SystemCallFilter=@system-service", "RestrictNamespaces=yes", "ProtectProc=invisible", "RemoveIPC=yes",
)
# The watchdog restarts the service (and may roll it back) through sudo and the root helper, which run inside its
# sandbox. In a unit with User=, systemd implies NoNewPrivileges= for every directive it enforces with seccomp
# (systemd.exec(7): LockPersonality, ProtectHostname, ProtectKernel*, RestrictRealtime, RestrictSUIDSGID,
# SystemCallArchitectures, ...), and sudo cannot run under NoNewPrivileges; the helper writes /etc/systemd/system
# and /var/lib/edgekit (no ProtectSystem=strict). So its unit keeps only what needs no seccomp, and a capability
# bounding set with the three sudo needs (checked with setpriv's --bounding-set), at every level.
CALLS_SUDO = frozenset({"watchdog"})
SUDO_HARDENING = ("PrivateTmp=yes", "ProtectControlGroups=yes", "KeyringMode=private", "UMask=0077",
                  "CapabilityBoundingSet=CAP_SETUID CAP_SETGID CAP_AUDIT_WRITE", "AmbientCapabilities=")


class BadSpec(ValueError):
    """A spec the renderer refuses: one sentence naming the field."""


def _text(field: str, value: object, empty: bool = False) -> str:
    if not isinstance(value, str):
        raise BadSpec(f"{field} must be a string")
    if not value and not empty:
        raise BadSpec(f"{field} is empty")
    if len(value) > MAX_VALUE:
        raise BadSpec(f"{field} is longer than {MAX_VALUE} characters")
    bad = next((c for c in value if not c.isprintable()), None)
    if bad is not None:
        raise BadSpec(f"{field} holds a character that is not printable (U+{ord(bad):04X})")
    return value


def _path(field: str, value: object, base: str) -> str:
    path = _text(field, value)
    if not path.startswith("/") or os.path.normpath(path) != path or "//" in path:
        raise BadSpec(f"{field} must be an absolute, normalised path ({path!r})")
    if path != base and not path.startswith(base.rstrip("/") + "/"):
        raise BadSpec(f"{field} ({path}) is not under the base {base}")
    return path


def check(spec: object, caller: str, base: str | None = None) -> dict:
    """``spec`` checked for ``caller`` (who runs the unit's installer): the spec itself, or BadSpec.

    ``base``: the caller's base as root recorded it (the helper); None where the caller's own word is its base (a
    root login, full sudo). A caller other than root may only install units that run as itself."""
    if not isinstance(spec, dict):
        raise BadSpec("the spec is not a JSON object")
    unknown = sorted(set(spec) - KEYS)
    if unknown:
        raise BadSpec(f"the spec has a field edgekit does not write ({unknown[0]!r})")
    if not UNIT_RE.fullmatch(_text("unit", spec.get("unit"))):
        raise BadSpec(f"unit {spec['unit']!r} is not an edgekit unit (edgekit-<name>.service)")
    if not isinstance(spec.get("role"), str) or spec["role"] not in ROLES:
        raise BadSpec(f"role must be one of {', '.join(ROLES)}")
    given = _text("base", spec.get("base"))
    if base is not None and given != base:
        raise BadSpec(f"base {given} is not {caller}'s edgekit base ({base})")
    base = _path("base", given, given)
    if not RELEASE_RE.fullmatch(_text("release", spec.get("release"))):
        raise BadSpec(f"release {spec['release']!r} is not a release id")
    argv = spec.get("argv")
    if not isinstance(argv, list) or not argv or len(argv) > MAX_ARGS:
        raise BadSpec(f"argv must be a list of 1 to {MAX_ARGS} strings")
    for i, arg in enumerate(argv):
        _text(f"argv[{i}]", arg, empty=i > 0)
    env = spec.get("env") or {}
    if not isinstance(env, dict):
        raise BadSpec("env must be a map of names to strings")
    for name, value in env.items():
        if not isinstance(name, str) or not ENV_NAME_RE.fullmatch(name):
            raise BadSpec(f"env name {name!r} is not a variable name")
        _text(f"env.{name}", value, empty=True)
    _path("log", spec.get("log"), base)
    for key in ("env_file", "key_file"):
        if spec.get(key) is not None:
            _path(key, spec[key], base)
    writable = spec.get("writable") or []
    if not isinstance(writable, list):
        raise BadSpec("writable must be a list of paths")
    for i, path in enumerate(writable):
        _path(f"writable[{i}]", path, base)
    if spec.get("restart", "on-failure") not in RESTART:
        raise BadSpec(f"restart must be one of {', '.join(RESTART)}")
    if spec.get("hardening", "default") not in HARDENING:
        raise BadSpec(f"hardening must be one of {', '.join(HARDENING)}")
    user = spec.get("user")
    if user is not None and not USER_RE.fullmatch(_text("user", user)):
        raise BadSpec(f"user {user!r} is not a user name")
    if caller != "root" and user != caller:
        raise BadSpec(f"the unit must run as {caller} (user {user!r})")
    return spec


def quote(word: str) -> str:
    """One ExecStart argument or Environment= assignment, in double quotes unless it is plain: systemd would split
    it on spaces, expand %specifiers and (in ExecStart) $VAR, and take a bare `;` as a second command."""
    if PLAIN_WORD.fullmatch(word):
        return word
    return '"' + word.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%").replace("$", "$$") + '"'


def quote_path(path: str) -> str:
    """A path in a list setting (ReadWritePaths=), or an Environment= assignment: systemd unquotes it and expands
    %specifiers, but `$` stays as it is."""
    if PLAIN_WORD.fullmatch(path):
        return path
    return '"' + path.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%") + '"'




def release_dir(spec: dict) -> str:
    return f"{spec['base']}/releases/{spec['release']}"


def exec_start(spec: dict) -> list:
    """The command the unit runs: the release's agent, which becomes ``argv`` (see service_exec.py)."""
    rdir = release_dir(spec)
    opts = ["--log", spec["log"]]
    opts += ["--env-file", spec["env_file"]] if spec.get("env_file") else []
    opts += ["--key-file", spec["key_file"]] if spec.get("key_file") else []
    return ["python3", "-B", f"{rdir}/agent/edgekit_agent.py", "exec", *opts, "--", *spec["argv"]]


def hardening(spec: dict) -> list:
    level = spec.get("hardening", "default")
    if level == "off":
        return []
    if spec["role"] in CALLS_SUDO:
        return list(SUDO_HARDENING)
    lines = list(DEFAULT_HARDENING)
    if level == "strict":
        writable = [f"{spec['base']}/logs", *(spec.get("writable") or [])]
        lines += [*STRICT_HARDENING, "ReadWritePaths=" + " ".join(quote_path("-" + p) for p in writable)]
    return lines


def render(spec: dict) -> str:
    """The unit file of a checked spec (see :func:`check`)."""
    rdir = release_dir(spec)
    env = {"LD_LIBRARY_PATH": f"{rdir}/lib", **(spec.get("env") or {})}
    argv = exec_start(spec)
    lines = [
        "[Unit]",
        f"Description=edgekit {ROLES[spec['role']]} (release {spec['release']})",
        "After=network-online.target",
        "Wants=network-online.target",
        "",
        "[Service]",
        "Type=simple",
        f"WorkingDirectory={rdir.replace('%', '%%')}",
        *(f"Environment={quote_path(f'{k}={v}')}" for k, v in env.items()),
        "ExecStart=" + " ".join([argv[0], *(quote(a) for a in argv[1:])]),
        f"Restart={spec.get('restart', 'on-failure')}",
        "RestartSec=3",
        "RestartPreventExitStatus=78",  # exec's refusal (EX_CONFIG: no proper key): trying again will not help
        *([f"User={spec['user']}"] if spec.get("user") else []),
        *hardening(spec),
        "",
        "[Install]",
        "WantedBy=multi-user.target",
        "",
    ]
    return "\n".join(lines)
