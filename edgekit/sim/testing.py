"""Sim boards as tests see them: addresses, paths, and SSH with edgekit's pinned host keys.

Connections load the known_hosts file `sim up` wrote and use RejectPolicy, like edgekit itself:
a board whose key is not pinned is refused, never trusted on first use.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import paramiko

from edgekit.config.profiles import get_profile
from edgekit.sim.rootfs import read_power
from edgekit.sim.state import BoardState, SimState


@dataclass(frozen=True)
class RunResult:
    rc: int
    stdout: str
    stderr: str


@dataclass(frozen=True)
class SimBoard:
    name: str
    host: str
    port: int
    user: str
    key: Path  # client private key
    known_hosts: Path
    profile: str
    base: Path  # the board file's `base`
    root: Path  # $EDGEKIT_BOARD_ROOT on the board
    dir: Path  # <sim dir>/<name>
    service_port: int
    sshd_pid: int

    @classmethod
    def from_state(cls, st: SimState, board: BoardState, known_hosts: Path) -> SimBoard:
        return cls(name=board.name, host=board.host, port=board.port, user=board.user, key=st.client_key,
                   known_hosts=known_hosts, profile=board.profile, base=board.base, root=board.root,
                   dir=board.path, service_port=board.service_port, sshd_pid=board.sshd_pid or 0)

    def connect(self, timeout: float = 10.0) -> paramiko.SSHClient:
        client = paramiko.SSHClient()
        client.load_host_keys(str(self.known_hosts))
        client.set_missing_host_key_policy(paramiko.RejectPolicy())
        client.connect(self.host, port=self.port, username=self.user, key_filename=str(self.key),
                       look_for_keys=False, allow_agent=False, timeout=timeout, banner_timeout=timeout,
                       auth_timeout=timeout)
        return client

    def run(self, command: str, timeout: float = 30.0) -> RunResult:
        """Run one shell command on the board (a new connection each time)."""
        with self.connect() as client:
            _, out, err = client.exec_command(command, timeout=timeout)
            rc = out.channel.recv_exit_status()
            return RunResult(rc, out.read().decode(errors="replace"), err.read().decode(errors="replace"))

    def logins(self) -> int:
        """SSH connections the board's sshd has accepted so far (its log, `sshd -e`)."""
        log = self.dir / "sshd.log"
        return log.read_text(errors="replace").count("Accepted publickey") if log.exists() else 0

    def power(self) -> dict[str, float]:
        """Watts per rail, read from the board's sysfs files."""
        return read_power(self.root)

    def total_watts(self) -> float:
        return self.power()[get_profile(self.profile).total_power_rail]
