"""A sim board's sshd: its config file, a config check, and starting it detached on 127.0.0.1."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path

from edgekit.errors import EdgekitError
from edgekit.sim import procs
from edgekit.sim.state import BoardState

_SBIN = ("/usr/sbin", "/usr/local/sbin", "/sbin")


def find_sshd() -> str:
    """sshd is often outside a normal user's PATH (/usr/sbin)."""
    path = os.pathsep.join([os.environ.get("PATH", ""), *_SBIN])
    found = shutil.which("sshd", path=path)
    if not found:
        raise EdgekitError("sshd was not found; simulated boards need OpenSSH's server "
                           "(Debian/Ubuntu: apt-get install openssh-server).")
    return found


def _quote(value: str) -> str:
    """sshd_config takes "double quoted" arguments; refuse what it cannot carry."""
    if any(c in value for c in '"\n\r\0'):
        raise EdgekitError(f"Cannot use {value!r} in an sshd config (quote or newline in a path).")
    return f'"{value}"' if any(c.isspace() or c in "#'\\" for c in value) else value


def config_text(board: BoardState, authorized_keys: Path, env: Mapping[str, str]) -> str:
    lines = [
        f"# sshd for the simulated Jetson board {board.name} (written by `edgekit sim up`)",
        f"ListenAddress 127.0.0.1:{board.port}",
        f"HostKey {_quote(str(board.host_key))}",
        f"PidFile {_quote(str(board.sshd_pidfile))}",
        f"AuthorizedKeysFile {_quote(str(authorized_keys))}",
        f"AllowUsers {board.user}",
        "PubkeyAuthentication yes",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "PermitRootLogin prohibit-password",  # CI runs as root; keys only
        "UsePAM no",  # PAM would need root and a service file
        "StrictModes no",  # the key files live in a temp dir with whatever modes it has
        "Subsystem sftp internal-sftp",
        "MaxStartups 100:30:200",  # fleet tests open many connections at once
        "MaxSessions 100",
        # As docs/deploy.md asks of real boards (15 s × 4), shorter: a workstation whose link died silently
        # loses its sessions, and the deploy lock with them, within 15 s.
        "ClientAliveInterval 5",
        "ClientAliveCountMax 3",
        "UseDNS no",
        "PrintMotd no",
        "PrintLastLog no",
        "X11Forwarding no",
        "LogLevel INFO",
        "SetEnv " + " ".join(_quote(f"{k}={v}") for k, v in env.items()),
    ]
    return "\n".join(lines) + "\n"


def write_config(board: BoardState, authorized_keys: Path, env: Mapping[str, str]) -> None:
    board.sshd_config.write_text(config_text(board, authorized_keys, env))


def prepare_privsep() -> None:
    """As root, Debian's sshd wants its privilege-separation dir /run/sshd."""
    if os.geteuid() == 0:
        try:
            Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
        except OSError as exc:
            raise EdgekitError(f"Cannot create /run/sshd, which sshd needs as root ({exc.strerror}).") from None


def check_config(sshd: str, board: BoardState) -> None:
    res = subprocess.run([sshd, "-t", "-f", str(board.sshd_config)], capture_output=True, text=True,
                         timeout=30, check=False)
    if res.returncode != 0:
        why = (res.stderr or res.stdout).strip().splitlines()
        raise EdgekitError(f"sshd rejects the config of {board.name} ({board.sshd_config}): "
                           f"{why[-1] if why else 'exit ' + str(res.returncode)}.")


def start(sshd: str, board: BoardState, tries: int = 3, avoid: set[int] | None = None,
          launcher: list[str] | None = None) -> None:
    """Start the board's sshd (behind ``launcher``, which execs it) and wait for its banner; on a lost
    port race, try another port."""
    avoid = set(avoid or ())
    for attempt in range(tries):
        argv = [*(launcher or []), sshd, "-f", str(board.sshd_config), "-D", "-e"]
        pid, ctime = procs.spawn_detached(argv, board.sshd_log)
        if procs.wait_ssh_banner(board.port, pid, board.sshd_pidfile):
            board.sshd_pid, board.sshd_ctime = pid, ctime
            return
        procs.stop(procs.tree(pid))
        if attempt + 1 < tries:
            # Most likely someone took the port between our probe and sshd's bind.
            avoid.add(board.port)
            text = board.sshd_config.read_text()
            board.port = procs.free_port(avoid, kind="ssh")
            board.sshd_config.write_text(_relisten(text, board.port))
    tail = board.sshd_log.read_text(errors="replace").strip().splitlines()[-1:] if board.sshd_log.exists() else []
    raise EdgekitError(f"sshd for {board.name} did not start on 127.0.0.1:{board.port}"
                       + (f": {tail[0]}" if tail else "") + f" (log: {board.sshd_log}).")


def _relisten(text: str, port: int) -> str:
    return "\n".join(f"ListenAddress 127.0.0.1:{port}" if line.startswith("ListenAddress ") else line
                     for line in text.splitlines()) + "\n"
