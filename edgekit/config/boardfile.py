"""The board file (edgekit.yaml): named boards with their SSH address, key and profile.

Every string of it (names, host, user, base, paths …) goes into SSH command lines, units or files on the board,
or ssh's own options: each must be printable (edgekit.config.printable), checked as the file is loaded."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from pydantic import ConfigDict, Field, field_validator, model_validator

from edgekit.config.names import check_name
from edgekit.config.printable import PrintableModel, UnprintableValue
from edgekit.config.profiles import get_profile
from edgekit.config.yamlfile import load_model
from edgekit.errors import EdgekitError
from edgekit.paths import config_dir, known_hosts_file

DEFAULT_BASE = "~/edgekit"
_HOST_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-:[]_")


class Board(PrintableModel):
    """A board; what one engine needs of it (the Python it serves with …) is that engine's section,
    ``<section>: {…}`` (``vllm``, ``litert``), which the engine validates (edgekit.engines.board_check)."""

    model_config = ConfigDict(extra="allow")  # the engines' sections

    host: str
    port: int = Field(22, ge=1, le=65535)
    user: str
    key: str | None = None  # private key file; None → the SSH agent / default keys
    profile: str
    base: str = DEFAULT_BASE
    known_hosts: str | None = None  # None → edgekit's own known_hosts
    service_port: int | None = Field(None, ge=1, le=65535)  # overrides the recipe's port on this board
    sim: bool = False  # a simulated board made by `edgekit sim up`
    local: bool = False  # the machine edgekit runs on (nightly CI on the board itself)
    # A link that carries no byte for this long is given up and the push resumed on a new connection.
    stall_s: int = Field(60, ge=3, le=3600)
    # Boards of one site reach each other cheaply: a fleet rollout sends each blob once per site (edgekit.fleet.sites)
    # and the site's boards take it from each other over HTTP at site_host:site_port (default: host, 8089).
    site: str | None = None
    site_host: str | None = None
    site_port: int = Field(8089, ge=1024, le=65535)

    @field_validator("host", "site_host")
    @classmethod
    def _host(cls, v: str | None) -> str | None:
        if v is not None and (not v or not set(v) <= _HOST_CHARS or v.startswith("-")):
            raise ValueError(f"host {v!r} is not a host name or IP address")
        return v

    @field_validator("site")
    @classmethod
    def _site(cls, v: str | None) -> str | None:
        return None if v is None else check_name(v, "site")

    @field_validator("user")
    @classmethod
    def _user(cls, v: str) -> str:
        return check_name(v, "user")

    @field_validator("profile")
    @classmethod
    def _profile(cls, v: str) -> str:
        try:
            get_profile(v)
        except EdgekitError as exc:
            raise ValueError(str(exc).rstrip(".")) from None
        return v

    @field_validator("base")
    @classmethod
    def _base(cls, v: str) -> str:
        parts = v.split("/")
        if not (v.startswith("/") or v == "~" or v.startswith("~/")) or ".." in parts:
            raise ValueError(f"base {v!r} must be an absolute path or start with ~/, without '..'")
        if any(c in v for c in "'\"\\"):
            # systemd refuses to run an executable whose path holds quotes or backslashes.
            raise ValueError(f"base {v!r} must not contain quotes or backslashes (systemd cannot run from there)")
        return v.rstrip("/") or "/"

    def section(self, key: str) -> dict[str, Any]:
        """An engine's own section of this board as written; {} when it has none."""
        value = (self.model_extra or {}).get(key)
        return dict(value) if isinstance(value, dict) else {}

    def key_path(self) -> Path | None:
        return Path(self.key).expanduser() if self.key else None

    def known_hosts_path(self) -> Path:
        return Path(self.known_hosts).expanduser() if self.known_hosts else known_hosts_file()


class BoardFile(PrintableModel):
    model_config = ConfigDict(extra="forbid")

    boards: dict[str, Board] = Field(default_factory=dict)
    groups: dict[str, list[str]] = Field(default_factory=dict)

    @field_validator("boards")
    @classmethod
    def _names(cls, v: dict[str, Board]) -> dict[str, Board]:
        for name in v:
            check_name(name, "board name")
        return v

    @model_validator(mode="after")
    def _groups(self) -> BoardFile:
        for group, members in self.groups.items():
            check_name(group, "group name")
            for member in members:
                if member not in self.boards:
                    raise ValueError(f"group {group!r} names board {member!r}, which is not in 'boards'")
        return self


def board_file_path(explicit: str | None) -> Path:
    """--config, then $EDGEKIT_CONFIG, then ./edgekit.yaml, then ~/.config/edgekit/edgekit.yaml."""
    if explicit:
        return Path(explicit).expanduser()
    if os.environ.get("EDGEKIT_CONFIG"):
        return Path(os.environ["EDGEKIT_CONFIG"]).expanduser()
    local = Path("edgekit.yaml")
    if local.is_file():
        return local
    return config_dir() / "edgekit.yaml"


class Boards:
    """The board file at a path: read it, resolve names, write it back atomically. ``check``: what a layer above
    checks of a file just loaded (the engines, their sections: edgekit.engines.board_check)."""

    def __init__(self, path: Path, check: Callable[[BoardFile, Path], None] | None = None) -> None:
        self.path, self.check = path, check

    def load(self) -> BoardFile:
        if not self.path.exists():
            return BoardFile()
        try:
            data = load_model(BoardFile, self.path, "board file")
        except UnprintableValue as exc:
            raise exc.within(f"board file {self.path}") from None
        if self.check is not None:
            self.check(data, self.path)
        return data

    def get(self, name: str) -> Board:
        data = self.load()
        if name not in data.boards:
            known = ", ".join(sorted(data.boards)) or "none"
            raise EdgekitError(f"No board named {name!r} in {self.path} (boards there: {known}).")
        return data.boards[name]

    def save(self, data: BoardFile) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        raw: dict[str, Any] = data.model_dump(exclude_defaults=True)
        raw.setdefault("boards", {})
        fd, tmp = tempfile.mkstemp(prefix=".edgekit-", dir=self.path.parent)
        with os.fdopen(fd, "w") as fh:
            yaml.safe_dump(raw, fh, sort_keys=False)
        os.replace(tmp, self.path)

    def update(self, add: dict[str, Board] | None = None, remove: list[str] | None = None) -> None:
        data = self.load()
        for name in remove or []:
            data.boards.pop(name, None)
            for members in data.groups.values():
                if name in members:
                    members.remove(name)
        data.boards.update(add or {})
        self.save(data)
