"""Links with a real rate for simulated boards: a network namespace of its own joined to this machine by a veth
pair, the way towards it shaped with tbf (netem is not in this kernel). Root only.

A simulated board's sshd listens on this machine's loopback, which a namespace cannot reach, so the path goes out
and back: edgekit → ``inner_ip:port`` (the packets leave through the shaped veth) → a relay inside the namespace →
``outer_ip`` (the unshaped way back) → a relay here → the board's sshd. What a push sends crosses the shaped
direction exactly once.

    with netns.uplink(rate_mbit=50) as up, netns.board_behind(up, board.port) as (host, port):
        ...  # connect to host:port; up.tx_bytes() counts what went towards the namespace
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from edgekit.sim.link import Link

RELAY_PORT = 2222  # inside the namespace: nothing else listens there


@dataclass(frozen=True)
class Uplink:
    ns: str  # the namespace's name
    outer: str  # the veth end on this machine (its egress is shaped)
    outer_ip: str
    inner_ip: str  # the veth end inside the namespace
    rate_mbit: float | None
    inner: str = ""  # its name

    def cut(self, down: bool) -> None:
        """The uplink dropped (``down``) or restored: the far end goes down, so what this machine sends is lost
        without an error, as when a site's link fails upstream; TCP retransmits until it comes back."""
        _ip("-n", self.ns, "link", "set", self.inner, "down" if down else "up")

    def tx_bytes(self) -> int:
        """Bytes sent from this machine towards the namespace (the interface's counter, IP and link headers too)."""
        return int(Path(f"/sys/class/net/{self.outer}/statistics/tx_bytes").read_text())

    def exec_argv(self, *argv: str) -> list[str]:
        return ["ip", "netns", "exec", self.ns, *argv]


def available() -> bool:
    """Whether this process can make namespaces and veth pairs (root, with iproute2)."""
    return os.geteuid() == 0 and shutil.which("ip") is not None and shutil.which("tc") is not None


def _ip(*args: str) -> None:
    res = subprocess.run(["ip", *args], capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {res.stderr.strip()}")


@contextlib.contextmanager
def uplink(rate_mbit: float | None, index: int | None = None) -> Iterator[Uplink]:
    """A namespace joined to this machine by a veth pair in 10.231.<index>.0/30, the way in capped at ``rate_mbit``
    (None: uncapped). Everything is removed at the end (deleting the namespace deletes both veth ends)."""
    k = (os.getpid() % 250 + 1) if index is None else index
    tag = f"ek{os.getpid() % 100000}x{k}"
    inner = f"{tag}b"[:15]
    up = Uplink(ns=tag, outer=f"{tag}a"[:15], outer_ip=f"10.231.{k}.1", inner_ip=f"10.231.{k}.2",
                rate_mbit=rate_mbit, inner=inner)
    _ip("netns", "add", up.ns)
    try:
        _ip("link", "add", up.outer, "type", "veth", "peer", "name", inner)
        _ip("link", "set", inner, "netns", up.ns)
        _ip("addr", "add", f"{up.outer_ip}/30", "dev", up.outer)
        _ip("link", "set", up.outer, "up")
        _ip("-n", up.ns, "addr", "add", f"{up.inner_ip}/30", "dev", inner)
        _ip("-n", up.ns, "link", "set", inner, "up")
        _ip("-n", up.ns, "link", "set", "lo", "up")
        if rate_mbit is not None:
            # burst: a few ms at the rate and at least one GSO segment (64 KiB), else tbf drops what veth hands it.
            burst = max(64 * 1024 * 4, int(rate_mbit * 1e6 / 8 * 0.004))
            subprocess.run(["tc", "qdisc", "add", "dev", up.outer, "root", "tbf", "rate", f"{rate_mbit}mbit",
                            "burst", str(burst), "latency", "100ms"], check=True, capture_output=True)
        yield up
    finally:
        subprocess.run(["ip", "netns", "del", up.ns], capture_output=True)


@contextlib.contextmanager
def board_behind(up: Uplink, board_port: int, inner_port: int = RELAY_PORT) -> Iterator[tuple[str, int]]:
    """``(host, port)`` that reaches the sshd at ``127.0.0.1:board_port`` through ``up``'s shaped veth (several
    boards behind one uplink: a different ``inner_port`` each)."""
    with Link(board_port, listen=(up.outer_ip, 0)) as back:
        relay = subprocess.Popen(up.exec_argv(sys.executable, "-m", "edgekit.sim.link", "--listen",
                                              f"{up.inner_ip}:{inner_port}", "--to", f"{up.outer_ip}:{back.port}"),
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert relay.stdout is not None
            if relay.stdout.readline().strip() != "ready":
                raise RuntimeError(f"the relay in {up.ns} did not start: {relay.communicate(timeout=10)[1][-500:]}")
            yield up.inner_ip, inner_port
        finally:
            relay.terminate()
            try:
                relay.wait(10)
            except subprocess.TimeoutExpired:
                relay.kill()
                relay.wait()
