"""edgekit's known_hosts: pinned board host keys, fingerprints, explicit trust."""

from __future__ import annotations

import base64
import hashlib
import os
import socket
import tempfile
from pathlib import Path

import paramiko

from edgekit.errors import EdgekitError


def host_entry(host: str, port: int) -> str:
    """The name OpenSSH and paramiko use in known_hosts for a host:port."""
    return host if port == 22 else f"[{host}]:{port}"


def fingerprint(key: paramiko.PKey) -> str:
    """OpenSSH-style SHA256 fingerprint, as `ssh-keygen -lf` prints it."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def load(path: Path) -> paramiko.HostKeys:
    keys = paramiko.HostKeys()
    if path.is_file():
        try:
            keys.load(str(path))
        except (OSError, paramiko.SSHException) as exc:
            raise EdgekitError(f"The known_hosts file {path} cannot be read: {exc}.") from None
    return keys


def known_key(path: Path, host: str, port: int) -> paramiko.PKey | None:
    entry = load(path).lookup(host_entry(host, port))
    if not entry:
        return None
    return next(iter(entry.values()), None)


def fetch_host_key(host: str, port: int, timeout: float = 10.0) -> paramiko.PKey:
    """Ask the SSH server for its host key without authenticating or trusting anything."""
    try:
        sock = socket.create_connection((host, port), timeout=timeout)
    except OSError as exc:
        raise EdgekitError(f"Cannot reach {host}:{port} ({exc.strerror or exc}).") from None
    transport = paramiko.Transport(sock)
    try:
        transport.banner_timeout = timeout
        transport.start_client(timeout=timeout)
        return transport.get_remote_server_key()
    except (paramiko.SSHException, OSError, EOFError) as exc:
        raise EdgekitError(f"{host}:{port} did not complete an SSH handshake ({exc}).") from None
    finally:
        transport.close()


def record(path: Path, host: str, port: int, key: paramiko.PKey) -> None:
    """Pin ``key`` for host:port, replacing any earlier key for that name; keep other lines."""
    name = host_entry(host, port)
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = path.read_text().splitlines() if path.is_file() else []
    kept = [ln for ln in lines if not _names_host(ln, name)]
    kept.append(f"{name} {key.get_name()} {key.get_base64()}")
    fd, tmp = tempfile.mkstemp(prefix=".known_hosts-", dir=path.parent)
    with os.fdopen(fd, "w") as fh:
        fh.write("\n".join(kept) + "\n")
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)


def forget(path: Path, host: str, port: int) -> None:
    if not path.is_file():
        return
    name = host_entry(host, port)
    lines = [ln for ln in path.read_text().splitlines() if not _names_host(ln, name)]
    fd, tmp = tempfile.mkstemp(prefix=".known_hosts-", dir=path.parent)
    with os.fdopen(fd, "w") as fh:
        fh.write("\n".join(lines) + ("\n" if lines else ""))
    os.replace(tmp, path)


def _names_host(line: str, name: str) -> bool:
    fields = line.split()
    return bool(fields) and not line.startswith("#") and name in fields[0].split(",")
