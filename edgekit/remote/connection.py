"""SSH connections to boards with a strict host-key policy.

Fabric's Connection accepts any host key by default and loads no known_hosts. edgekit pins
each board's key in its own known_hosts and refuses unknown or changed keys: a board is trusted
only through `edgekit board trust`, which shows the fingerprint first.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import threading
import time

import paramiko
from fabric import Config, Connection

from edgekit.config.boardfile import Board
from edgekit.errors import EdgekitError
from edgekit.remote import hostkeys
from edgekit.remote.fastsftp import gcm_transport

CONNECT_TIMEOUT_S = 10
# paramiko logs a refused port forward ("Secsh channel N open FAILED") at ERROR, which Python prints
# when nothing is configured; edgekit polls a starting server that way and reports failures itself.
logging.getLogger("paramiko.transport").addHandler(logging.NullHandler())
logging.getLogger("paramiko.transport").propagate = False


class _RejectUnknown(paramiko.RejectPolicy):
    """Refuse unknown hosts, remembering the offered key so the error can show its fingerprint."""

    def __init__(self) -> None:
        self.offered: paramiko.PKey | None = None

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        self.offered = key
        raise paramiko.SSHException(f"unknown host key for {hostname}")


def connection(board: Board, name: str, timeout: int = CONNECT_TIMEOUT_S) -> Connection:
    """An unopened Fabric Connection to ``board`` that will only accept its pinned host key."""
    key_path = board.key_path()
    if key_path is not None and not key_path.is_file():
        raise EdgekitError(f"The key file {key_path} for board {name!r} does not exist.")
    connect_kwargs = {
        "look_for_keys": key_path is None,
        "allow_agent": True,
        "banner_timeout": timeout,
        "auth_timeout": timeout,
    }
    if key_path is not None:
        connect_kwargs["key_filename"] = [str(key_path)]
    # AES-GCM from the first key exchange: about twice the SFTP throughput of the default cipher.
    connect_kwargs["transport_factory"] = gcm_transport
    # The board file is the single source of truth for addresses: ignore ~/.ssh/config.
    config = Config(overrides={"load_ssh_configs": False})
    conn = Connection(
        host=board.host, user=board.user, port=board.port, config=config,
        connect_timeout=timeout, connect_kwargs=connect_kwargs,
    )
    client = conn.client
    client.get_host_keys().clear()
    known = board.known_hosts_path()
    for hostname, keys in hostkeys.load(known).items():
        for keytype, key in keys.items():
            client.get_host_keys().add(hostname, keytype, key)
    policy = _RejectUnknown()
    client.set_missing_host_key_policy(policy)
    conn._edgekit = (name, board, policy)  # type: ignore[attr-defined]
    return conn


def open_connection(board: Board, name: str, timeout: int = CONNECT_TIMEOUT_S) -> Connection:
    """Open ``connection()``, turning every SSH failure into one clear sentence."""
    conn = connection(board, name, timeout)
    policy: _RejectUnknown = conn._edgekit[2]  # type: ignore[attr-defined]
    where = f"{board.user}@{board.host}:{board.port}"
    known = board.known_hosts_path()
    try:
        conn.open()
    except paramiko.BadHostKeyException as exc:
        raise EdgekitError(
            f"The host key of board {name!r} ({where}) has CHANGED to {hostkeys.fingerprint(exc.key)}; "
            f"it does not match the one pinned in {known}. If the board was reinstalled, run "
            f"`edgekit board trust --board {name} --replace`."
        ) from None
    except paramiko.PasswordRequiredException:
        raise EdgekitError(f"The key file {board.key} is encrypted; load it into ssh-agent first.") from None
    except paramiko.AuthenticationException:
        raise EdgekitError(
            f"Board {name!r} ({where}) refused the SSH key{f' {board.key}' if board.key else 's offered'}; "
            "edgekit uses key authentication only."
        ) from None
    except paramiko.SSHException as exc:
        if policy.offered is not None:
            raise EdgekitError(
                f"Board {name!r} ({where}) is not trusted yet: its host key "
                f"{policy.offered.get_name()} {hostkeys.fingerprint(policy.offered)} is not in {known}; "
                f"check the fingerprint, then run `edgekit board trust --board {name}`."
            ) from None
        raise EdgekitError(f"SSH to board {name!r} ({where}) failed: {exc}.") from None
    except TimeoutError:
        raise EdgekitError(f"Board {name!r} ({where}) did not answer within {timeout} s.") from None
    except EOFError:  # accepted, then closed before SSH began (a firewall, a relay with nowhere to go)
        raise EdgekitError(f"Board {name!r} ({where}) closed the connection before SSH began.") from None
    except OSError as exc:
        raise EdgekitError(f"Cannot reach board {name!r} ({where}): {exc.strerror or exc}.") from None
    _Liveness(conn.client.get_transport(), board.stall_s).start()
    return conn


def _ask(transport: paramiko.Transport, answered: threading.Event) -> None:
    """One keep-alive that wants a reply; any reply will do (sshd refuses the request: that is an answer)."""
    with contextlib.suppress(Exception):
        transport.global_request("keepalive@openssh.com", wait=True)
    answered.set()


class _Liveness(threading.Thread):
    """OpenSSH's ServerAliveInterval for a paramiko connection: a keep-alive every ``stall_s / 3`` s that needs an
    answer; none within ``stall_s`` closes the transport, so a command waiting on a stalled link ends (and the
    runner says the link was lost) instead of waiting forever. Ends with the transport."""

    def __init__(self, transport: paramiko.Transport | None, stall_s: int) -> None:
        super().__init__(daemon=True, name="edgekit-liveness")
        self.transport, self.stall_s = transport, stall_s

    def run(self) -> None:
        transport = self.transport
        while transport is not None and transport.is_active():
            time.sleep(max(1, self.stall_s // 3))
            answered = threading.Event()
            threading.Thread(target=_ask, args=(transport, answered), daemon=True).start()
            if not answered.wait(self.stall_s):
                transport.close()
                return


# The OpenSSH client's preferences, as edgekit's paramiko connections: AES-GCM first (hardware AES on x86,
# Orin and Thor; no separate MAC pass), and curve25519 for the key exchange. OpenSSH 9's default exchange,
# the post-quantum sntrup761x25519, costs the client 66 ms of CPU per connection here against 8 ms, and a
# fleet run opens one per board, a push one per large blob. The rest of each list: OpenSSH's defaults.
OPENSSH_CIPHERS = ("aes128-gcm@openssh.com,aes256-gcm@openssh.com,chacha20-poly1305@openssh.com,"
                   "aes128-ctr,aes192-ctr,aes256-ctr")
OPENSSH_KEX = ("curve25519-sha256,curve25519-sha256@libssh.org,ecdh-sha2-nistp256,ecdh-sha2-nistp384,"
               "ecdh-sha2-nistp521,diffie-hellman-group-exchange-sha256,diffie-hellman-group16-sha512,"
               "diffie-hellman-group18-sha512,diffie-hellman-group14-sha256")


def openssh_options(board: Board) -> list[str]:
    """OpenSSH client options with the same policy: only edgekit's pinned host key, only the board's key
    (and paramiko's cipher and key exchange)."""
    known = str(board.known_hosts_path())
    if any(c.isspace() for c in known):  # ssh splits UserKnownHostsFile on whitespace
        raise EdgekitError(f"The known_hosts path {known!r} contains whitespace, which ssh cannot take.")
    args = ["-o", f"UserKnownHostsFile={known}", "-o", "GlobalKnownHostsFile=/dev/null",
            "-o", "StrictHostKeyChecking=yes", "-o", f"Ciphers={OPENSSH_CIPHERS}", "-o", f"KexAlgorithms={OPENSSH_KEX}"]
    if board.key:
        args += ["-o", "IdentitiesOnly=yes"]  # offer only the board's key, as edgekit does
    return args


def keepalive_options(board: Board) -> list[str]:
    """ssh gives up a link that answers no keep-alive for ``board.stall_s`` (3 probes): a stall ends in exit 255."""
    every = max(1, board.stall_s // 3)
    return ["-o", f"ServerAliveInterval={every}", "-o", "ServerAliveCountMax=3"]


def ssh_binary() -> str | None:
    return shutil.which("ssh")


def ssh_argv(board: Board) -> list[str]:
    """``ssh`` to the board with edgekit's policy and the board file's address; ~/.ssh/config is not read."""
    exe = ssh_binary()
    if exe is None:
        raise EdgekitError("OpenSSH's ssh client is not installed.")
    argv = [exe, "-F", "/dev/null", "-p", str(board.port), "-l", board.user, "-o", "BatchMode=yes",
            "-o", f"ConnectTimeout={CONNECT_TIMEOUT_S}", *keepalive_options(board), *openssh_options(board)]
    if board.key_path() is not None:
        argv += ["-i", str(board.key_path())]
    return [*argv, board.host]
