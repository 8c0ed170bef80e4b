"""SSH keys for sim boards (ed25519, OpenSSH format) and pinning them in a known_hosts file."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from paramiko.hostkeys import HostKeys


def generate_ed25519(path: Path, comment: str) -> str:
    """Write a new private key (0600) and ``<path>.pub``; return "ssh-ed25519 AAAA…"."""
    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
    )
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    path.parent.mkdir(parents=True, exist_ok=True)
    _write(path, private, 0o600)  # sshd refuses a host key others can read
    _write(path.with_name(path.name + ".pub"), public + f" {comment}\n".encode(), 0o644)
    return public.decode()


def public_key(path: Path) -> str:
    """"ssh-ed25519 AAAA…" of a key made by generate_ed25519 (comment dropped)."""
    return " ".join(path.with_name(path.name + ".pub").read_text().split()[:2])


def _write(path: Path, data: bytes, mode: int) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}-", dir=path.parent)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def _names_host(line: str, hosts: set[str]) -> bool:
    """Does this known_hosts line name one of ``hosts`` (plain, comma list or hashed)?"""
    fields = line.split()
    if not fields or line.lstrip().startswith("#"):
        return False
    if fields[0].startswith("@"):  # @cert-authority / @revoked lines are the user's business
        return False
    for pattern in fields[0].split(","):
        if pattern in hosts:
            return True
        if pattern.startswith("|1|"):
            salt = pattern.split("|")[2]
            if any(HostKeys.hash_host(h, salt) == pattern for h in hosts):
                return True
    return False


def update_known_hosts(path: Path, pin: Mapping[str, str] | None = None, unpin: Iterable[str] = ()) -> None:
    """Drop every line for the hosts in ``pin`` and ``unpin``, then add one line per ``pin`` entry.

    Keys of ``pin`` are known_hosts names ("[127.0.0.1]:2222"), values "ssh-ed25519 AAAA…".
    Other lines (other hosts, comments, markers) stay as they are.
    """
    pin = dict(pin or {})
    drop = set(pin) | set(unpin)
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        if not pin:
            return
        lines = []
    kept = [line for line in lines if not _names_host(line, drop)]
    kept += [f"{name} {key}" for name, key in pin.items()]
    if kept == lines:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    mode = 0o600
    with contextlib.suppress(FileNotFoundError):
        mode = path.stat().st_mode & 0o777
    _write(path, ("\n".join(kept) + "\n" if kept else "").encode(), mode)
