"""HTTP to a port on the board, through the SSH connection (direct-tcpip), so nothing has to be
installed on the board and the server can stay bound to the board's loopback."""

from __future__ import annotations

import http.client
import json
import socket
from dataclasses import dataclass
from typing import Any

import paramiko

from edgekit.remote.mux import MuxRunner, ProcStream
from edgekit.remote.runner import LocalRunner, SshRunner


@dataclass
class HttpResponse:
    status: int
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body.decode() or "null")


def _open(runner: SshRunner | LocalRunner, port: int, timeout: float) -> Any:
    if isinstance(runner, LocalRunner):
        return socket.create_connection(("127.0.0.1", port), timeout=timeout)
    if isinstance(runner, MuxRunner):  # through the board's OpenSSH master; a closed port reads as EOF
        return ProcStream(runner.forward(port), timeout)
    transport = runner.conn.transport
    chan = transport.open_channel("direct-tcpip", ("127.0.0.1", port), ("127.0.0.1", 0), timeout=timeout)
    chan.settimeout(timeout)
    return chan


def request(
    runner: SshRunner | LocalRunner,
    port: int,
    method: str,
    path: str,
    payload: Any = None,
    timeout: float = 60.0,
    api_key: str | None = None,
) -> HttpResponse:
    """One HTTP/1.1 request to 127.0.0.1:port on the board (with ``api_key``, as its bearer); raises
    ConnectionError if nothing listens."""
    body = json.dumps(payload).encode() if payload is not None else b""
    auth = f"Authorization: Bearer {api_key}\r\n" if api_key else ""
    head = (
        f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n{auth}"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    try:
        sock = _open(runner, port, timeout)
    except (paramiko.ChannelException, paramiko.SSHException, OSError) as exc:
        raise ConnectionError(f"nothing answers on the board's port {port} ({exc})") from None
    try:
        sock.sendall(head.encode() + body)
        resp = http.client.HTTPResponse(sock)  # type: ignore[arg-type]
        resp.begin()
        return HttpResponse(resp.status, resp.read())
    except (TimeoutError, OSError, http.client.HTTPException) as exc:
        if isinstance(sock, ProcStream) and sock.refused():
            raise ConnectionError(f"nothing answers on the board's port {port}") from None
        raise ConnectionError(f"the board's port {port} broke off the request ({exc})") from None
    finally:
        sock.close()
