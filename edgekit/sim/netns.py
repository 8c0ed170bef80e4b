"""Links with a real rate for simulated boards: a network namespace of its own joined to this machine by a veth
pair, the way towards it shaped with tbf (netem is not in this kernel). Root only.

A simulated board's sshd listens on this machine's loopback, which a namespace cannot reach, so the path goes out
and back: edgekit → ``inner_ip:port`` (the packets leave through the shaped veth) → a relay inside the namespace →
``outer_ip`` (the unshaped way back) → a relay here → the board's sshd. What a push sends crosses the shaped
direction exactly once.

    with netns.uplink(rate_mbit=50) as up, netns.board_behind(up, board.port) as (host, port):
        ...  # connect to host:port; up.tx_bytes() counts what went towards the namespace

A simulated **site** puts each board in a namespace of its own instead: a bridge (the site's LAN) in the uplink's
namespace, a veth from it to each board's namespace, and the board's sshd started inside (a second sshd with the
board's config, listening on the board's LAN address): what the board starts (nginx, aria2c, its server) lives
there too, so the boards reach each other over the bridge, and the workstation reaches them through the shaped
uplink, routed by the uplink's namespace.

    with netns.site(rate_mbit=20, boards=3) as lan:
        with netns.sshd_in(lan, 0, board.dir / "ssh" / "sshd_config", board.dir / "sshd-site.log") as (host, port):
            ...  # host is the board's LAN address (also its site_host); port 22
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from edgekit.sim.link import Link
from edgekit.sim.sshd import find_sshd

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


@dataclass(frozen=True)
class SiteLan:
    uplink: Uplink
    prefix: str  # the LAN's first three octets: 10.232.<index>
    namespaces: tuple[str, ...]  # one per board

    def address(self, i: int) -> str:
        """Board ``i``'s address on the site's LAN."""
        return f"{self.prefix}.{10 + i}"

    def sent_by(self, i: int) -> int:
        """Bytes board ``i`` has sent onto the LAN (its bridge port's receive counter)."""
        res = subprocess.run(self.uplink.exec_argv("cat", f"/sys/class/net/p{i}/statistics/rx_bytes"),
                             capture_output=True, text=True, check=True)
        return int(res.stdout)


@contextlib.contextmanager
def site(rate_mbit: float | None, boards: int, index: int | None = None) -> Iterator[SiteLan]:
    """``boards`` namespaces on one bridge, behind one uplink capped at ``rate_mbit`` (see the module's docstring);
    everything removed at the end."""
    with uplink(rate_mbit, index) as up:
        prefix = f"10.232.{up.outer_ip.split('.')[2]}"
        _ip("-n", up.ns, "link", "add", "lan", "type", "bridge")
        _ip("-n", up.ns, "addr", "add", f"{prefix}.1/24", "dev", "lan")
        _ip("-n", up.ns, "link", "set", "lan", "up")
        # forwarding between the uplink and the LAN (the namespace's own /proc/sys; no procps needed)
        subprocess.run(up.exec_argv("sh", "-c", "echo 1 > /proc/sys/net/ipv4/ip_forward"), check=True,
                       capture_output=True)
        _ip("route", "add", f"{prefix}.0/24", "via", up.inner_ip)  # goes with the uplink's veth
        made: list[str] = []
        try:
            for i in range(boards):
                # a veth pair made here (names unique on this machine), each end moved and renamed: the bridge's
                # end p<i> in the uplink's namespace, the board's eth0 in its own
                ns, port, end, peer = f"{up.ns}n{i}", f"p{i}", f"{up.ns}e{i}"[:15], f"{up.ns}f{i}"[:15]
                _ip("netns", "add", ns)
                made.append(ns)
                _ip("link", "add", end, "type", "veth", "peer", "name", peer)
                _ip("link", "set", end, "netns", up.ns)
                _ip("-n", up.ns, "link", "set", end, "name", port)
                _ip("-n", up.ns, "link", "set", port, "master", "lan")
                _ip("-n", up.ns, "link", "set", port, "up")
                _ip("link", "set", peer, "netns", ns)
                _ip("-n", ns, "link", "set", peer, "name", "eth0")
                _ip("-n", ns, "addr", "add", f"{prefix}.{10 + i}/24", "dev", "eth0")
                _ip("-n", ns, "link", "set", "eth0", "up")
                _ip("-n", ns, "link", "set", "lo", "up")
                _ip("-n", ns, "route", "add", "default", "via", f"{prefix}.1")
            yield SiteLan(up, prefix, tuple(made))
        finally:
            for ns in made:
                subprocess.run(["ip", "netns", "del", ns], capture_output=True)


@contextlib.contextmanager
def sshd_in(lan: SiteLan, i: int, config: Path, log: Path) -> Iterator[tuple[str, int]]:
    """The board whose sshd config is ``config`` reachable at ``(its LAN address, 22)``: a second sshd with that
    config inside board ``i``'s namespace (the first, on this machine's loopback, keeps running)."""
    host = lan.address(i)
    own = config.with_name(f"{config.name}.site{i}")
    lines = [f"ListenAddress {host}:22" if ln.startswith("ListenAddress ") else
             f"PidFile {own.with_suffix('.pid')}" if ln.startswith("PidFile ") else ln
             for ln in config.read_text().splitlines()]
    own.write_text("\n".join(lines) + "\n")
    with open(log, "ab") as out:
        proc = subprocess.Popen(["ip", "netns", "exec", lan.namespaces[i], find_sshd(), "-f", str(own), "-D", "-e"],
                                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 15
        while not _banner(host, 22):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"sshd in {lan.namespaces[i]} did not start: {log.read_text()[-500:]}")
            time.sleep(0.05)
        yield host, 22
    finally:
        proc.terminate()  # the listener only: sessions and what they started end with the board
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _banner(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1) as s:
            return s.recv(4).startswith(b"SSH-")
    except OSError:
        return False
