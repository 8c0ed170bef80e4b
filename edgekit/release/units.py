"""The systemd units that run a release's server from its directory (the main one, and a candidate beside it)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

UNIT_NAME = "edgekit-serve.service"
CANDIDATE_UNIT = "edgekit-serve-candidate.service"  # a new release, health-checked beside the old one
WATCHDOG_UNIT = "edgekit-watchdog.service"  # restarts a wedged server, caps its logs (agent/watchdog.py)
WATCHDOG_LOG_NAME = "watchdog.log"
LOG_NAME, CANDIDATE_LOG_NAME = "server.log", "server-candidate.log"  # under <base>/logs/
# The service's names before they were engine-neutral (edgekit 0.1 up to the board-side activation), and where
# that unit logs. A board such an edgekit deployed is upgraded by the next activation (the old unit stopped and
# removed as the new one starts), and its releases still roll back: their unit file is taken under the new name.
LEGACY_UNITS = {"edgekit-llama.service": "llama-server.log"}
LEGACY_CANDIDATE_UNITS = ("edgekit-llama-candidate.service",)  # removed before a candidate takes the port


def run_as_fields(user: str | None) -> dict[str, str]:
    """What release.json (and so the release id) says of who its units run as; nothing for root."""
    return {"run_as": user} if user else {}


def service_log(base: str, candidate: bool = False) -> str:
    return f"{base}/logs/{CANDIDATE_LOG_NAME if candidate else LOG_NAME}"


def activation_program(base: str, rid: str) -> list[str]:
    """The program that switches these units (agent/activate.py, carried by every release) as argv; -B: running
    it never writes bytecode into the release, which stays byte for byte what was pushed."""
    return activation_program_at(f"{base}/releases/{rid}")


def activation_program_at(release_dir: str) -> list[str]:
    return ["python3", "-B", f"{release_dir}/agent/edgekit_agent.py"]


def systemd_quote(arg: str, executable: bool = False) -> str:
    """Quote one ExecStart argument: systemd expands $VAR and %specifiers, and splits on spaces.

    The executable itself gets no `$$`: systemd takes its path literally after %specifiers.
    """
    escaped = arg.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%")
    if not executable:
        escaped = escaped.replace("$", "$$")
    if escaped and not any(c in escaped for c in " \t'\"\\") and escaped == arg:
        return arg
    return f'"{escaped}"'


def systemd_path(path: str) -> str:
    """A path setting (WorkingDirectory=, append:): taken literally except for %specifiers."""
    if any(c in path for c in "\n\0"):
        raise ValueError(f"{path!r} contains a control character")
    return path.replace("%", "%%")


def render_unit(
    release_dir: str,
    argv: Sequence[str],
    log_file: str,
    description: str,
    user: str | None = None,
    environment: Mapping[str, str] | None = None,
    environment_file: str | None = None,
    restart: str = "on-failure",
) -> str:
    """A unit whose ExecStart names the release directory itself (not `current`).

    Pointing at the release, not at the `current` symlink, lets a new release be started and
    health-checked while `current` still names the last good one.

    ``user``: the unit runs as that user (the login user where it is not root). systemd would open an
    ``append:`` log and read an ``EnvironmentFile=`` as root, before it changes user, through any symlink the
    user left; so such a unit starts the release's agent (``exec``), which opens both as the user and then
    becomes the server. The board's root helper (agent/privileged.py) accepts no other shape for a user's unit.
    """
    env = {"LD_LIBRARY_PATH": f"{release_dir}/lib", **(environment or {})}
    if user:
        argv = [*activation_program_at(release_dir), "exec", "--log", log_file,
                *(["--env-file", environment_file] if environment_file else []), "--", *argv]
    output = [] if user else [f"StandardOutput=append:{systemd_path(log_file)}",
                              f"StandardError=append:{systemd_path(log_file)}"]
    lines = [
        "[Unit]",
        f"Description={description}",
        "After=network-online.target",
        "Wants=network-online.target",
        "",
        "[Service]",
        "Type=simple",
        f"WorkingDirectory={systemd_path(release_dir)}",
        *(f"Environment={systemd_quote(f'{k}={v}')}" for k, v in env.items()),
        # A secret (the API key) comes from a 0600 file, so it is in no unit file and no command line.
        *([f"EnvironmentFile={systemd_path(environment_file)}"] if environment_file and not user else []),
        "ExecStart=" + " ".join(systemd_quote(a, executable=i == 0) for i, a in enumerate(argv)),
        f"Restart={restart}",
        "RestartSec=3",
        *output,
    ]
    if user:
        lines.append(f"User={user}")
    lines += ["", "[Install]", "WantedBy=multi-user.target", ""]
    return "\n".join(lines)


def watchdog_argv(base: str, rid: str, port: int, every_s: float, timeout_s: float, failures: int, restarts: int,
                  window_s: float, start_grace_s: float) -> list[str]:
    """The release's watchdog (agent/watchdog.py) over the main unit on ``port``."""
    return [*activation_program(base, rid), "watchdog", "--base", base, "--port", str(port), "--unit", UNIT_NAME,
            "--log", service_log(base), "--candidate-log", service_log(base, candidate=True),
            *(arg for unit in LEGACY_UNITS for arg in ("--legacy-unit", unit)),
            "--every", f"{every_s:g}", "--timeout", f"{timeout_s:g}", "--failures", str(failures),
            "--restarts", str(restarts), "--window", f"{window_s:g}", "--start-grace", f"{start_grace_s:g}"]
