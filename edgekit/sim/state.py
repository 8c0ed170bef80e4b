"""The sim dir's state.json: which boards run where (pids, ports, dirs), written atomically."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import tempfile
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

STATE_FILE = "state.json"
SERVICES_RUN_DIR = "run/systemd-sim"  # under a board root: <unit>.pid etc. (see bin/systemctl)


@dataclass
class BoardState:
    name: str
    profile: str  # canonical profile name (aliases resolved)
    dir: str  # <sim dir>/<name>, absolute
    port: int
    service_port: int
    user: str
    host_key_pub: str  # "ssh-ed25519 AAAA…"
    sshd_pid: int | None = None
    sshd_ctime: float | None = None
    jetpack: str | None = None  # the JetPack line it presents (None: its profile's own)
    arch: str | None = None  # "aarch64": an emulated board (qemu-user); None: this machine's own

    @property
    def emulated(self) -> bool:
        return self.arch is not None

    @property
    def path(self) -> Path:
        return Path(self.dir)

    @property
    def root(self) -> Path:
        """What / is on a real board: /etc/nv_tegra_release, /sys/bus/i2c/devices, …"""
        return self.path / "root"

    @property
    def base(self) -> Path:
        """The board file's `base`: where edgekit keeps releases on the board."""
        return self.path / "base"

    @property
    def bin_dir(self) -> Path:
        return self.path / "bin"

    @property
    def ssh_dir(self) -> Path:
        return self.path / "ssh"

    @property
    def host_key(self) -> Path:
        return self.ssh_dir / "ssh_host_ed25519_key"

    @property
    def sshd_config(self) -> Path:
        return self.ssh_dir / "sshd_config"

    @property
    def sshd_log(self) -> Path:
        return self.path / "sshd.log"

    @property
    def sshd_pidfile(self) -> Path:
        return self.ssh_dir / "sshd.pid"

    @property
    def power_trace(self) -> Path:
        """Optional scripted power: {"start": epoch_s, "points": [[t_s, watts_total], …]}."""
        return self.path / "power_trace.json"

    @property
    def thermal_trace(self) -> Path:
        """Optional scripted heat: {"start": epoch_s, "points": [[t_s, °C], …]} for every thermal zone."""
        return self.path / "thermal_trace.json"

    @property
    def services_dir(self) -> Path:
        return self.root / SERVICES_RUN_DIR

    @property
    def host(self) -> str:
        return "127.0.0.1"

    @property
    def known_hosts_name(self) -> str:
        return f"[{self.host}]:{self.port}"


@dataclass
class SimState:
    dir: str
    token: str  # EDGEKIT_SIM_ID on every board session: finds stray processes at `down`
    boards: dict[str, BoardState] = field(default_factory=dict)
    updater_pid: int | None = None
    updater_ctime: float | None = None
    board_files: list[str] = field(default_factory=list)  # where `up` wrote the boards
    known_hosts_files: list[str] = field(default_factory=list)  # where `up` pinned their keys
    volatile_dir: str | None = None  # tmpfs dir holding the boards' sys/ trees (see rootfs)
    version: int = 1

    @property
    def path(self) -> Path:
        return Path(self.dir)

    @property
    def client_key(self) -> Path:
        """The private key every sim board accepts (made once per sim dir)."""
        return self.path / "client" / "id_ed25519"

    @property
    def authorized_keys(self) -> Path:
        return self.path / "client" / "authorized_keys"

    @property
    def updater_log(self) -> Path:
        return self.path / "power.log"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> SimState:
        boards = {k: BoardState(**v) for k, v in raw.pop("boards", {}).items()}
        return cls(boards=boards, **raw)


def state_path(sim_dir: Path) -> Path:
    return sim_dir / STATE_FILE


def load(sim_dir: Path) -> SimState | None:
    try:
        raw = json.loads(state_path(sim_dir).read_text())
    except (FileNotFoundError, NotADirectoryError):
        return None
    return SimState.from_json(raw)


def save(state: SimState) -> None:
    path = state_path(state.path)
    fd, tmp = tempfile.mkstemp(prefix=".state-", dir=state.path)
    with os.fdopen(fd, "w") as fh:
        json.dump(state.to_json(), fh, indent=2)
    os.replace(tmp, path)  # the power updater re-reads this file while we write it


def remove(sim_dir: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        state_path(sim_dir).unlink()


@contextlib.contextmanager
def locked(sim_dir: Path) -> Iterator[None]:
    """One `sim up`/`sim down` at a time per sim dir."""
    sim_dir.mkdir(parents=True, exist_ok=True)
    with open(sim_dir / ".lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
