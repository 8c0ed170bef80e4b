"""Push blobs into a board's content-addressed store, ``<base>/store/<sha256>``.

Only blobs the board lacks are sent (one verb of edgekit's agent finds them: agent/blobstore.py, which does every
board-side step here). Each goes to
``<sha>.part``, resumes from the remote size after an interruption, is hashed on the board while
it arrives, and is renamed into place (SFTP posix-rename) only once its sha256 matches: a file at
its final path is always complete and verified. Remote names are hashes only, so no file name
from a recipe or the local disk ever reaches the board.
"""

from __future__ import annotations

import json
import queue
import re
import shlex
import threading
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import paramiko
from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

from edgekit.errors import EdgekitError, LinkLost
from edgekit.remote import agent_call, agent_ship, fastsftp, sshstream
from edgekit.remote.connection import ssh_binary
from edgekit.remote.runner import SshRunner

STORE_DIR = "store"
FREE_MARGIN_BYTES = 16 << 20  # plus 1 %: room for logs and the filesystem's own needs
VERIFY_LINE_TIMEOUT_S = 300.0  # the board-side hash of the last blob must finish within this
OPENSSH_MIN_BYTES = 16 << 20  # smaller blobs stay on the open SFTP connection (an ssh session costs ≈ 0.1 s)
_SHA_RE = re.compile(r"[0-9a-f]{64}")
Verify = Literal["auto", "openssh", "stream", "after"]
FOLLOW = "follow"  # the agent's verb that hashes SFTP uploads as they land


def check_sha256(value: str) -> str:
    """``value`` if it is a lowercase hex sha256, else an EdgekitError: board names are hashes only."""
    if not isinstance(value, str) or not _SHA_RE.fullmatch(value):
        raise EdgekitError(f"{value!r} is not a sha256 (64 lowercase hex digits); board store names are hashes only.")
    return value


@dataclass(frozen=True)
class Blob:
    sha256: str
    size: int
    path: Path
    executable: bool = False

    def __post_init__(self) -> None:
        check_sha256(self.sha256)
        if not isinstance(self.size, int) or self.size < 0:
            raise EdgekitError(f"Blob {self.sha256[:12]} has an invalid size {self.size!r}.")
        object.__setattr__(self, "path", Path(self.path))


@dataclass
class PushReport:
    sent_bytes: int = 0
    sent_blobs: int = 0
    skipped_blobs: int = 0
    resumed_bytes: int = 0
    rechecked_bytes: int = 0  # blobs already on the board, hashed again before a release is activated from them
    corrupt_blobs: int = 0  # of those, copies that were not what their name says: deleted and sent anew
    seconds: float = 0.0
    retries: int = 0  # new connections after a lost link (edgekit.deploy.link_retry)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def store_path(root: str, sha256: str) -> str:
    """The path of a blob on the board, for a base already passed through ``resolve_base``."""
    return f"{root.rstrip('/')}/{STORE_DIR}/{check_sha256(sha256)}"


# ---------------------------------------------------------------------------------------- progress


class TransferProgress:
    """Rich progress (bytes, MB/s, ETA), one task per board; shared safely by push threads."""

    def __init__(self, console: Console | None = None, *, disable: bool = False) -> None:
        self.progress = Progress(
            TextColumn("[bold]{task.description}"), BarColumn(), DownloadColumn(),
            TransferSpeedColumn(), TimeRemainingColumn(), TextColumn("{task.fields[note]}"),
            console=console, disable=disable,
        )
        self._tasks: dict[str, TaskID] = {}
        self._lock = threading.Lock()

    def __enter__(self) -> TransferProgress:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()

    def start_board(self, board: str, total: int) -> None:
        with self._lock:
            if board in self._tasks:
                self.progress.reset(self._tasks[board], total=total, note="")
            else:
                self._tasks[board] = self.progress.add_task(board, total=total, note="")

    def add_total(self, board: str, extra: int) -> None:
        task = self._tasks[board]
        self.progress.update(task, total=(self.progress.tasks[self._index(task)].total or 0) + extra)

    def advance(self, board: str, n: int) -> None:
        self.progress.advance(self._tasks[board], n)

    def finish(self, board: str, note: str) -> None:
        self.progress.update(self._tasks[board], note=note)

    def counts(self, board: str) -> tuple[float, float | None]:
        """(completed, total) bytes of a board's task."""
        task = self.progress.tasks[self._index(self._tasks[board])]
        return task.completed, task.total

    def _index(self, task: TaskID) -> int:
        return next(i for i, t in enumerate(self.progress.tasks) if t.id == task)


# ------------------------------------------------------------------------------------ board facts


def resolve_base(runner: SshRunner, base: str) -> str:
    """``base`` as an absolute path: a leading ``~`` becomes the login's $HOME (one command)."""
    if base != "~" and not base.startswith("~/"):
        if not base.startswith("/"):
            raise EdgekitError(f"The base directory {base!r} of board {runner.name!r} is not absolute.")
        return base.rstrip("/") or "/"
    home = runner.run(["printenv", "HOME"], check=False).stdout.removesuffix("\n")
    if not home.startswith("/") or "\n" in home:
        raise EdgekitError(f"Board {runner.name!r} reports an unusable $HOME ({home!r}).")
    return (home.rstrip("/") + base[1:]).rstrip("/") or "/"


@dataclass
class _Inventory:
    present: dict[str, bool] = field(default_factory=dict)  # sha -> executable
    parts: dict[str, int] = field(default_factory=dict)  # sha -> bytes already in <sha>.part
    free_bytes: int | None = None  # None: the board could not say, so no check


def _inventory(runner: SshRunner, store: str, root: str, shas: list[str], create: bool = True) -> _Inventory:
    got = agent_call.call(runner, root, "inventory", *(["--create"] if create else []), store, *shas, timeout=120,
                          doing=f"Preparing the store {store}")
    free = got.get("free_bytes")
    return _Inventory({k: bool(v) for k, v in (got.get("have") or {}).items()},
                      {k: int(v) for k, v in (got.get("parts") or {}).items()},
                      int(free) if isinstance(free, int) else None)


# ------------------------------------------------------------------------------------ verification


class _StreamVerifier:
    """The agent's ``follow`` on its own channel: hashes each .part while it is uploaded."""

    def __init__(self, transport: paramiko.Transport, agent: str, paths: list[tuple[str, int]]) -> None:
        argv = agent_ship.argv(agent, FOLLOW)
        for path, size in paths:
            argv += [path, str(size)]
        self.chan = transport.open_session()
        self.chan.exec_command(shlex.join(argv))
        self.lines: queue.Queue[tuple[int, str] | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        try:
            for line in self.chan.makefile("r"):
                got = json.loads(line)
                self.lines.put((int(got["index"]), str(got["digest"])))
        except (OSError, EOFError, paramiko.SSHException, ValueError, KeyError, TypeError):
            pass
        self.lines.put(None)  # the verifier ended

    def ready(self) -> list[tuple[int, str]]:
        out = []
        while True:
            try:
                item = self.lines.get_nowait()
            except queue.Empty:
                return out
            if item is None:
                self.lines.put(None)
                return out
            out.append(item)

    def next(self, board: str) -> tuple[int, str] | None:
        """The next (index, digest), or None once the verifier has ended (e.g. it could not run)."""
        try:
            item = self.lines.get(timeout=VERIFY_LINE_TIMEOUT_S)
        except queue.Empty:
            raise EdgekitError(f"Board {board!r} did not finish hashing an upload within "
                               f"{VERIFY_LINE_TIMEOUT_S:.0f} s.") from None
        if item is None:
            self.lines.put(None)
        return item

    def close(self) -> None:
        self.chan.close()  # the board-side process sees stdin EOF and exits
        self._reader.join(timeout=5)


def _hash_after(runner: SshRunner, root: str, store: str, blobs: list[Blob], parts: bool = True) -> dict[str, str]:
    """sha -> hex digest of each ``<sha>.part`` (hashed on the board after the upload, fsynced), or of ``<sha>``."""
    total = sum(b.size for b in blobs)
    got = agent_call.call(runner, root, "hash", *(["--parts"] if parts else []), store, *(b.sha256 for b in blobs),
                          timeout=120 + total / 20e6, doing="Hashing the uploads")
    return {str(k): str(v) for k, v in (got.get("digests") or {}).items()}


# ------------------------------------------------------------------------------------------- push


class _Push:
    """One push to one board; see ``push_blobs``."""

    def __init__(self, runner: SshRunner, root: str, store: str, progress: TransferProgress | None) -> None:
        self.runner, self.name, self.root, self.store, self.progress = runner, runner.name, root, store, progress
        self.agent = agent_ship.ensure(runner, root)
        self.report = PushReport()
        self._sftp: paramiko.SFTPClient | None = None

    def part(self, blob: Blob) -> str:
        return f"{self.store}/{blob.sha256}.part"

    def final(self, blob: Blob) -> str:
        return f"{self.store}/{blob.sha256}"

    def on_bytes(self, n: int) -> None:
        if self.progress is not None:
            self.progress.advance(self.name, n)

    @property
    def sftp(self) -> paramiko.SFTPClient:
        if self._sftp is None:
            fastsftp.prefer_gcm(self.runner.conn.client.get_transport())
            self._sftp = self.runner.sftp()
            self._sftp.get_channel().settimeout(float(self.runner.board.stall_s))  # a stall ends as a timeout
        return self._sftp

    def openssh_round(self, todo: list[tuple[Blob, int]]) -> list[tuple[Blob, int]]:
        """Upload, hash and place each (blob, resume offset), one OpenSSH session each (sshstream.py)."""
        redo: list[tuple[Blob, int]] = []
        for blob, offset in todo:
            item = sshstream.Item(blob.sha256, blob.size, offset, blob.executable, blob.path)
            word, sent = sshstream.upload(self.runner.board, self.name, self.agent, self.store, item, self.on_bytes)
            self.report.sent_bytes += sent
            if word == "ok":
                self.report.sent_blobs += 1
                self.report.resumed_bytes += offset
            else:
                self.settle(blob, offset, word, redo)  # not placed: deletes the part, then redo or raise
        return redo

    def upload_round(self, todo: list[tuple[Blob, int]], stream: bool) -> list[tuple[Blob, int]]:
        """Upload, verify and place each (blob, resume offset); return the ones to redo from 0."""
        redo: list[tuple[Blob, int]] = []
        pending = set(range(len(todo)))

        def settle(j: int, digest: str) -> None:
            if j in pending:
                pending.discard(j)
                self.settle(*todo[j], digest, redo)

        sftp = self.sftp
        verifier = None
        if stream:
            transport = self.runner.conn.client.get_transport()
            verifier = _StreamVerifier(transport, self.agent, [(self.part(b), b.size) for b, _ in todo])
        try:
            for blob, offset in todo:
                if offset < blob.size or blob.size == 0:
                    try:
                        sent = fastsftp.upload(sftp, blob.path, self.part(blob), blob.size, offset, self.on_bytes)
                    except (OSError, EOFError, paramiko.SSHException) as exc:
                        raise _lost_or_refused(self.runner, exc)(
                            f"Uploading {blob.path.name} to board {self.name!r} failed ({exc or type(exc).__name__});"
                            " run the push again to resume where it stopped."
                        ) from None
                    self.report.sent_bytes += sent
                for j, digest in verifier.ready() if verifier else ():
                    settle(j, digest)  # place finished blobs early: a later cut keeps them
            while verifier is not None and pending and (item := verifier.next(self.name)) is not None:
                settle(*item)
            if pending:  # no streaming verifier, or it ended early: hash what is left after the fact
                digests = _hash_after(self.runner, self.root, self.store, [todo[j][0] for j in sorted(pending)])
                for j in sorted(pending):
                    settle(j, digests.get(todo[j][0].sha256, "missing"))
        finally:
            if verifier is not None:
                verifier.close()
        return redo

    def settle(self, blob: Blob, offset: int, digest: str, redo: list[tuple[Blob, int]]) -> None:
        """Place a verified .part at its final path, or delete it and redo / raise."""
        if digest not in (blob.sha256, "long"):
            # The streaming hash is the fast path; an after-the-fact hash decides (rare, cheap).
            digest = _hash_after(self.runner, self.root, self.store, [blob]).get(blob.sha256, digest)
        if digest == blob.sha256:
            self.sftp.chmod(self.part(blob), 0o755 if blob.executable else 0o644)
            self.sftp.posix_rename(self.part(blob), self.final(blob))  # atomic; replaces
            self.report.sent_blobs += 1
            self.report.resumed_bytes += offset
            return
        self.sftp.remove(self.part(blob))
        if offset > 0:  # the resumed prefix was bad (another writer, a crash): send it all again
            redo.append((blob, 0))
            if self.progress is not None:
                self.progress.add_total(self.name, blob.size)
            return
        got = "more bytes than its size" if digest == "long" else f"sha256 {digest[:16]}…"
        raise EdgekitError(
            f"{blob.path.name} arrived on board {self.name!r} with {got}, not sha256 {blob.sha256[:16]}…; "
            "the upload was deleted. The local file no longer matches its manifest: rebuild the artifact."
        )


def _lost_or_refused(runner: SshRunner, exc: BaseException) -> type[EdgekitError]:
    """LinkLost (worth a new connection) when the link went or stalled; EdgekitError when the board refused
    (a full disk, a permission) on a connection that still works."""
    transport = runner.conn.client.get_transport()
    alive = transport is not None and transport.is_active()
    return EdgekitError if alive and not isinstance(exc, (TimeoutError, EOFError)) else LinkLost


def _unique(blobs: Iterable[Blob]) -> dict[str, Blob]:
    out: dict[str, Blob] = {}
    for b in blobs:
        if not isinstance(b, Blob):
            raise EdgekitError(f"push_blobs takes Blob objects, not {type(b).__name__}.")
        prev = out.get(b.sha256)
        # One file per content on the board: executable if any user needs it executable.
        out[b.sha256] = b if prev is None or b.executable else prev
    return out


def drop_corrupt(runner: SshRunner, base: str, blobs: list[Blob]) -> list[str]:
    """The board's stored copies of ``blobs`` hashed again: a copy whose sha256 is not its name (corrupted at rest:
    a bad sector, a hand edit) is deleted, so the next push sends it. Returns the shas deleted. What a board serves
    to others (a site's seed) goes through this first; a push alone trusts what its inventory finds by name."""
    wanted = _unique(blobs)
    root = resolve_base(runner, base)
    store = f"{root.rstrip('/')}/{STORE_DIR}"
    total = sum(b.size for b in wanted.values())
    got = agent_call.call(runner, root, "check", store, *wanted, timeout=120 + total / 20e6,
                          doing=f"Checking the store {store}")
    return [str(sha) for sha in got.get("bad") or []]


def push_blobs(
    runner: SshRunner,
    base: str,
    blobs: list[Blob],
    progress: TransferProgress | None = None,
    *,
    verify: Verify = "auto",
    recheck_for: str | None = None,
) -> PushReport:
    """Make ``<base>/store/<sha256>`` exist on the board for every blob; send only what is missing.

    ``recheck_for``: the release about to be activated from these blobs. Those the board already has are hashed
    again first (a full sha256: size and mtime do not change when a disk rots), and a bad copy is deleted and
    sent as if missing; the release's directory, if made from a bad copy, is made again.

    ``verify``: "openssh" sends through the OpenSSH client and the agent hashes on the board as the bytes land
    (the fastest), "stream" uploads by SFTP while the agent hashes on the board, "after" hashes each .part once
    uploaded; "auto" picks openssh when this machine has the OpenSSH client, else stream. Every board-side step is
    a verb of edgekit's agent (sent first where the board lacks this version).
    """
    t0 = time.monotonic()
    wanted = _unique(blobs)
    for b in wanted.values():
        try:
            local_size = b.path.stat().st_size
        except OSError:
            raise EdgekitError(f"The local file {b.path} for blob {b.sha256[:12]} is missing.") from None
        if local_size != b.size:
            raise EdgekitError(f"{b.path} is {local_size} bytes but its manifest says {b.size}; rebuild the artifact.")
    root = resolve_base(runner, base)
    store = f"{root.rstrip('/')}/{STORE_DIR}"
    inv = _inventory(runner, store, root, list(wanted))
    push = _Push(runner, root, store, progress)
    if recheck_for is not None and inv.present:
        size = sum(wanted[sha].size for sha in inv.present)
        got = agent_call.call(runner, root, "check", "--release", f"{root.rstrip('/')}/releases/{recheck_for}",
                              store, *inv.present, timeout=120 + size / 20e6,
                              doing="Hashing the blobs the release is made of again")
        push.report.rechecked_bytes = int(got.get("bytes") or 0)
        push.report.corrupt_blobs = len(got.get("bad") or [])
        for sha in got.get("bad") or []:
            inv.present.pop(sha, None)
    missing = [b for sha, b in wanted.items() if sha not in inv.present]
    push.report.skipped_blobs = len(wanted) - len(missing)
    # A .part longer than its blob cannot be a prefix of it: start that one over.
    todo = [(b, p if (p := inv.parts.get(b.sha256, 0)) <= b.size else 0) for b in missing]
    to_send = sum(b.size - off for b, off in todo)
    needed = to_send + FREE_MARGIN_BYTES + to_send // 100 if todo else 0
    if todo and inv.free_bytes is not None and inv.free_bytes < needed:
        raise EdgekitError(
            f"Board {runner.name!r} has {inv.free_bytes / 1e6:.1f} MB free in {store} but the push needs "
            f"{needed / 1e6:.1f} MB ({to_send / 1e6:.1f} MB of blobs + margin); nothing was sent."
        )
    if progress is not None:
        progress.start_board(runner.name, to_send)
    try:
        for sha, b in wanted.items():
            if inv.present.get(sha) is False and b.executable:  # same content, now needed executable
                push.sftp.chmod(push.final(b), 0o755)
        for b, off in todo:
            if off == 0 and b.sha256 in inv.parts:  # a stale .part we restart: the verifier must not read it
                push.sftp.remove(push.part(b))
        stream = verify in ("stream", "auto")
        # OpenSSH carries the bytes when this machine has it (the agent hashes them as they land).
        openssh = verify == "openssh" or (verify == "auto" and ssh_binary() is not None)
        for _ in range(2):
            if not todo:
                break
            big = [t for t in todo if openssh and (verify == "openssh" or t[0].size - t[1] >= OPENSSH_MIN_BYTES)]
            small = [t for t in todo if t not in big]
            todo = (push.openssh_round(big) if big else []) + (push.upload_round(small, stream) if small else [])
        if todo:
            raise EdgekitError(f"Uploads to board {runner.name!r} kept failing their sha256 check.")
    except (OSError, EOFError, paramiko.SSHException) as exc:
        why = exc or type(exc).__name__
        raise _lost_or_refused(runner, exc)(f"The push to board {runner.name!r} failed: {why}.") from None
    push.report.seconds = round(time.monotonic() - t0, 3)
    if progress is not None:
        r = push.report
        progress.finish(runner.name, f"{r.sent_blobs} sent, {r.skipped_blobs} already there")
    return push.report


class PushResults(dict[str, "PushReport | Exception"]):
    """Results keyed by board name, like Fabric's GroupResult: one board's failure is data."""

    @property
    def succeeded(self) -> dict[str, PushReport]:
        return {k: v for k, v in self.items() if isinstance(v, PushReport)}

    @property
    def failed(self) -> dict[str, Exception]:
        return {k: v for k, v in self.items() if isinstance(v, Exception)}


def push_many(
    pairs: list[tuple[SshRunner, str]],
    blobs: list[Blob],
    progress: TransferProgress | None = None,
    *,
    max_workers: int = 16,
    verify: Verify = "auto",
) -> PushResults:
    """``push_blobs`` to every (runner, base) in parallel threads; never raises for one board."""
    results = PushResults()
    if not pairs:
        return results
    with ThreadPoolExecutor(max_workers=min(max_workers, len(pairs)), thread_name_prefix="push") as pool:
        futures = {
            runner.name: pool.submit(push_blobs, runner, base, blobs, progress, verify=verify) for runner, base in pairs
        }
        for name, fut in futures.items():
            try:
                results[name] = fut.result()
            except Exception as exc:  # reported per board, like Fabric's GroupException
                results[name] = exc
    return results
