"""A link between the workstation and a simulated board that tests and benchmarks can cut and stall: a TCP relay
on loopback (netem is not in this kernel). Connect to ``link.port`` instead of the board's sshd port.

    with Link(board.port) as link:     # relays 127.0.0.1:link.port → 127.0.0.1:board.port
        ...; link.cut()                # every connection through it reset at once (a dropped Wi-Fi, a pulled cable)
        ...; link.stall()              # bytes stop both ways, connections stay open (a link that hangs)
        link.stall(existing_only=True) # only the connections open now hang (a NAT that lost their state)
        link.resume()                  # bytes flow again
        link.partition(); link.heal()  # cut, and new connections refused until healed (the board is unreachable)
        link.sent_to_board             # payload bytes it has delivered towards the board
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
from pathlib import Path
from types import TracebackType

from edgekit.config.boardfile import Boards
from edgekit.remote import hostkeys

CHUNK = 64 * 1024


class Link:
    def __init__(self, target_port: int, target_host: str = "127.0.0.1", listen: tuple[str, int] = ("127.0.0.1", 0)
                 ) -> None:
        self.target = (target_host, target_port)
        self._listener = socket.create_server(listen)
        self.port: int = self._listener.getsockname()[1]
        self._flowing = threading.Event()
        self._flowing.set()
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._gates: list[threading.Event] = []  # one per connection: cleared, that connection hangs
        self._closed = False
        self._refusing = False
        self.sent_to_board = 0
        self._acceptor = threading.Thread(target=self._accept, daemon=True)

    def __enter__(self) -> Link:
        self._acceptor.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    # ------------------------------------------------------------------ controls

    def cut(self) -> None:
        """Reset every connection through the link, both ends (as a router that drops its state resets them);
        new ones may connect. (The shutdown wakes the relay's threads blocked on the sockets: a bare close from
        another thread would leave the socket open until they return, and the ends would never learn.)"""
        with self._lock:
            doomed, self._sockets = self._sockets, []
            gates, self._gates = self._gates, []
        for sock in doomed:
            _reset(sock)
        for gate in gates:  # a relay thread held at a stalled gate meets its reset socket and ends
            gate.set()

    def partition(self) -> None:
        """Cut, and refuse every new connection until ``heal``: the board is unreachable."""
        self._refusing = True
        self.cut()

    def heal(self) -> None:
        self._refusing = False

    def stall(self, existing_only: bool = False) -> None:
        if not existing_only:
            self._flowing.clear()
        with self._lock:
            for gate in self._gates:
                gate.clear()

    def resume(self) -> None:
        self._flowing.set()
        with self._lock:
            for gate in self._gates:
                gate.set()

    def close(self) -> None:
        self._closed = True
        self.resume()
        with contextlib.suppress(OSError):
            self._listener.close()
        self.cut()

    # ------------------------------------------------------------------ the relay

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if self._refusing:
                _reset(client)
                continue
            try:
                board = socket.create_connection(self.target, timeout=10)
                board.settimeout(None)
            except OSError:
                client.close()
                continue
            gate = threading.Event()
            gate.set()
            with self._lock:
                self._sockets += [client, board]
                self._gates.append(gate)
            threading.Thread(target=self._pump, args=(client, board, gate, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(board, client, gate, False), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, gate: threading.Event, to_board: bool) -> None:
        try:
            while True:
                data = src.recv(CHUNK)
                if not data:
                    break
                self._flowing.wait()  # a stalled link holds the bytes; the connection stays open
                gate.wait()
                dst.sendall(data)
                if to_board:
                    self.sent_to_board += len(data)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)


def _reset(sock: socket.socket) -> None:
    """Close with a reset (SO_LINGER 0) after a shutdown, which wakes a relay thread blocked on it."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sock.close()


def route(board_file: Path, known_hosts: Path, board_name: str, link: Link, **update: object) -> str:
    """The board again in the board file as ``<name>-via-link``, reached through ``link`` (``update``: other fields
    of that entry, e.g. ``stall_s``), its host key pinned for the link's port. Returns the new name."""
    return route_to(board_file, known_hosts, board_name, "127.0.0.1", link.port, **update)


def route_to(board_file: Path, known_hosts: Path, board_name: str, host: str, port: int, **update: object) -> str:
    """``route`` to any address that leads to the board (e.g. a relay in a network namespace)."""
    boards = Boards(board_file)
    entry = boards.load().boards[board_name]
    name = f"{board_name}-via-link"
    boards.update(add={name: entry.model_copy(update={"host": host, "port": port, **update})})
    key = hostkeys.known_key(known_hosts, entry.host, entry.port)
    if key is None:
        raise ValueError(f"board {board_name!r} has no pinned host key in {known_hosts}")
    hostkeys.record(known_hosts, host, port, key)
    return name


def main(argv: list[str] | None = None) -> int:
    """``python -m edgekit.sim.link --listen HOST:PORT --to HOST:PORT``: a relay on its own, e.g. inside a network
    namespace (edgekit.sim.netns), until SIGTERM. Prints "ready" once it listens."""
    import argparse
    import signal

    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("--listen", required=True)
    ap.add_argument("--to", required=True)
    args = ap.parse_args(argv)
    lhost, _, lport = args.listen.rpartition(":")
    thost, _, tport = args.to.rpartition(":")
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    with Link(int(tport), thost, listen=(lhost, int(lport))):
        print("ready", flush=True)
        done.wait()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
