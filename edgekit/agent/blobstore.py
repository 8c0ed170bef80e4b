"""The board's content-addressed store (``<base>/store/<sha256>``), as the agent changes it.

    inventory  [--create] STORE SHA...        which blobs the board has (and their mode), partial uploads, free space
    receive    STORE SHA SIZE OFFSET [--executable]   stdin → <sha>.part (resumed at OFFSET), hashed, renamed in place
    hash       [--parts] STORE SHA...        sha256 of each stored blob (or of its .part), flushed to disk
    check      [--release DIR] STORE SHA...  each stored blob hashed again; one whose sha256 is not its name deleted
    follow     PATH SIZE [PATH SIZE ...]     hash files while another channel writes them (SFTP uploads)
    place      [--tar] STORE SHA MODE ...    uploaded parts (or a tar stream of them on stdin) hashed, made durable
                                             together and renamed into place; the bad ones deleted

Every verb but ``follow`` (a line per file as it finishes) prints one JSON object. A blob reaches its final name
only when its sha256 matches: ``os.replace`` of a fsynced part, so a power cut leaves either the whole blob or a part
to resume. Standard library only (Python 3.8).
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import hashlib
import json
import os
import queue
import re
import select
import shutil
import stat
import sys
import tarfile
import threading
from typing import Any, BinaryIO

CHUNK = 1 << 20
SYNC_EVERY = 64 << 20  # fdatasync this often while writing: the final fsync is then short
F_SETPIPE_SZ = 1031  # named in fcntl only from Python 3.10
CUT = 3  # receive's exit status when the stream ended before SIZE bytes
_SHA = re.compile(r"^[0-9a-f]{64}$")


class StoreError(ValueError):
    """One sentence for the workstation (the agent's exit 2, as for any ValueError)."""


def is_sha(name: str) -> bool:
    return bool(_SHA.match(name))


def check_sha(sha: str) -> str:
    if not _SHA.match(sha):
        raise StoreError(f"{sha!r} is not a sha256")
    return sha


def free_bytes(path: str) -> int | None:
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def inventory(store: str, shas: list[str], create: bool = False) -> dict[str, Any]:
    """``have``: sha → executable, for each blob present; ``parts``: sha → bytes of its .part; ``free_bytes``."""
    if create:
        try:
            os.makedirs(store, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"cannot make the store {store}: {exc.strerror}") from None
    have: dict[str, bool] = {}
    parts: dict[str, int] = {}
    for sha in map(check_sha, shas):
        full = os.path.join(store, sha)
        try:
            st = os.stat(full)
        except OSError:
            with contextlib.suppress(OSError):
                parts[sha] = os.stat(full + ".part").st_size
            continue
        if stat.S_ISREG(st.st_mode):
            have[sha] = bool(st.st_mode & stat.S_IXUSR)
    return {"store": store, "exists": os.path.isdir(store), "have": have, "parts": parts,
            "free_bytes": free_bytes(store) if os.path.isdir(store) else None}


def hash_file(path: str, flush: bool = False) -> str:
    """sha256 of a file (``flush``: fsynced too, as it is about to be renamed into place)."""
    h = hashlib.sha256()
    with open(path, "rb", buffering=0) as f:
        buf = bytearray(4 * CHUNK)
        view = memoryview(buf)
        while True:
            n = f.readinto(buf)
            if not n:
                break
            h.update(view[:n])
        if flush:
            os.fsync(f.fileno())
    return h.hexdigest()


def hash_blobs(store: str, shas: list[str], parts: bool = False) -> dict[str, Any]:
    """sha → hex digest of ``<sha>`` (or ``<sha>.part``, fsynced: it is about to be renamed); missing ones absent."""
    digests: dict[str, str] = {}
    for sha in map(check_sha, shas):
        path = os.path.join(store, sha + (".part" if parts else ""))
        try:
            digests[sha] = hash_file(path, flush=parts)
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise StoreError(f"cannot read {path}: {exc.strerror}") from None
    return {"digests": digests}


def check(store: str, shas: list[str], release: str | None = None) -> dict[str, Any]:
    """Each stored blob hashed again (a bad sector, a hand edit: size and mtime do not change when a disk rots); a
    copy whose sha256 is not its name is deleted, so the next push sends it. ``release`` (``<base>/releases/<id>``,
    about to be activated): its hard links share the bad copies' inodes, so when any is bad and it is not what
    ``current`` points at, it is removed too, to be made again from the mended store."""
    got = hash_blobs(store, shas)["digests"]
    bad = sorted(sha for sha, digest in got.items() if digest != sha)
    for sha in bad:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(store, sha))
    dropped = False
    if bad and release and os.path.isdir(release):
        current = os.path.join(os.path.dirname(os.path.dirname(release.rstrip("/"))), "current")
        if os.path.realpath(current) != os.path.realpath(release):
            shutil.rmtree(release)
            dropped = True
    checked = sorted(got)
    size = 0
    for sha in checked:
        if sha not in bad:
            size += os.path.getsize(os.path.join(store, sha))
    return {"checked": len(checked), "bytes": size, "bad": bad, "missing": sorted(set(shas) - set(got)),
            "release_dropped": dropped}


def place(store: str, sha: str, executable: bool) -> None:
    """``<sha>.part`` (verified) → ``<sha>``, with its mode: one atomic rename."""
    part = os.path.join(store, sha + ".part")
    os.chmod(part, 0o755 if executable else 0o644)
    os.replace(part, os.path.join(store, sha))


def _widen_pipe(fd: int) -> None:
    # sshd hands stdin over a pipe: at its default 64 KiB the receiver woke 16 times a MiB, and a 1 GiB push on
    # loopback took 3.1-3.5 s; with a 1 MiB pipe 1.5-2.6 s.
    if stat.S_ISFIFO(os.fstat(fd).st_mode):
        with contextlib.suppress(OSError):
            fcntl.fcntl(fd, F_SETPIPE_SZ, CHUNK)


class _Writer:
    """Bytes from stdin into a part file; hashing and fdatasync in threads beside the read loop, so each byte is
    read once, in memory, and the loop never waits for the disk. 16 reused 1 MiB buffers: at most 16 MiB held."""

    def __init__(self, f: BinaryIO, h: Any) -> None:
        self.f, self.h = f, h
        self.hashing: queue.Queue = queue.Queue()
        self.syncing: queue.Queue = queue.Queue()
        self.free: queue.Queue = queue.Queue()
        for _ in range(16):
            self.free.put(bytearray(CHUNK))
        self.threads = [threading.Thread(target=self._hash, daemon=True),
                        threading.Thread(target=self._sync, daemon=True)]
        for t in self.threads:
            t.start()

    def _hash(self) -> None:
        while True:
            view = self.hashing.get()
            if view is None:
                return
            self.h.update(view)  # hashlib releases the GIL for large updates
            self.free.put(view.obj)

    def _sync(self) -> None:
        while self.syncing.get() is not None:
            os.fdatasync(self.f.fileno())

    def copy(self, inp: BinaryIO, left: int) -> bool:
        """Copy ``left`` bytes; False when the stream ended first (what arrived stays in the part)."""
        unsynced = 0
        complete = True
        while left and complete:
            view, n, want = memoryview(self.free.get()), 0, min(CHUNK, left)
            while n < want:
                k = inp.readinto(view[n:want])
                if not k:
                    complete = False
                    break
                n += k
            w = 0
            while w < n:
                w += self.f.write(view[w:n])
            self.hashing.put(view[:n])
            left -= n
            unsynced += n
            if unsynced >= SYNC_EVERY:
                self.syncing.put(1)
                unsynced = 0
        self.hashing.put(None)
        self.syncing.put(None)
        for t in self.threads:
            t.join()
        return complete


def receive(store: str, sha: str, size: int, offset: int, executable: bool, inp: BinaryIO,
            upto: int | None = None) -> dict[str, Any]:
    """Bytes ``offset..size`` of a blob from ``inp`` into ``<sha>.part`` (the part's first ``offset`` bytes are
    hashed first), then placed when the sha256 matches. ``result``: "ok" (placed), "short" (the part held less than
    ``offset``) or the digest it had; ``cut``: the stream ended early.

    ``upto`` (< size): only bytes ``offset..upto`` arrive in this call (a transport that carries a blob in pieces,
    such as Ansible's commands): appended and flushed, not hashed; ``result`` "partial". The call that brings the
    last byte hashes the whole part."""
    check_sha(sha)
    if not 0 <= offset <= size:
        raise StoreError(f"offset {offset} is outside the blob's {size} bytes")
    part = os.path.join(store, sha + ".part")
    try:
        if upto is not None and upto < size:
            return _append(part, offset, upto, inp)
        return _receive(part, store, sha, size, offset, executable, inp)
    except OSError as exc:  # a full disk, a permission: what arrived stays in the part
        raise StoreError(f"cannot write {part}: {exc.strerror or exc}") from None


def _append(part: str, offset: int, upto: int, inp: BinaryIO) -> dict[str, Any]:
    if not offset <= upto:
        raise StoreError(f"upto {upto} is before offset {offset}")
    with open(part, "r+b" if offset else "wb", buffering=0) as f:
        if os.fstat(f.fileno()).st_size < offset:
            return {"result": "short", "cut": False}
        f.seek(offset)
        left = upto - offset
        while left:
            b = inp.read(min(CHUNK, left))
            if not b:
                f.truncate()
                os.fdatasync(f.fileno())
                return {"result": "cut", "cut": True}
            f.write(b)
            left -= len(b)
        f.truncate()
        os.fdatasync(f.fileno())
    return {"result": "partial", "cut": False, "have": upto}


def _receive(part: str, store: str, sha: str, size: int, offset: int, executable: bool,
             inp: BinaryIO) -> dict[str, Any]:
    h = hashlib.sha256()
    with open(part, "r+b" if offset else "wb", buffering=0) as f:
        have = 0
        while have < offset:  # the resumed prefix
            b = f.read(min(CHUNK, offset - have))
            if not b:
                break
            h.update(b)
            have += len(b)
        f.seek(offset)
        if not _Writer(f, h).copy(inp, size - offset):
            return {"result": "cut", "cut": True}
        f.truncate()
        os.fsync(f.fileno())  # on disk before it can get its final name
    digest = h.hexdigest() if have == offset else "short"
    if digest == sha:
        place(store, sha, executable)
        digest = "ok"
    return {"result": digest, "cut": False}


def _host_gone(fd: int) -> bool:
    if select.select([fd], [], [], 0.01)[0]:
        return not os.read(fd, 1)
    return False


def follow(pairs: list[tuple[str, int]], out: Any = None, control: int = 0) -> int:
    """Hash each file *while* another channel uploads it, in upload order, so verifying costs no pass at the end;
    print ``{"index": I, "digest": HEX}`` (``"long"`` for a file longer than SIZE) as each completes. Ends as soon
    as the host closes ``control`` (stdin): a killed push leaves no process. Exit 5 then, else 0."""
    out = out or sys.stdout
    for i, (path, size) in enumerate(pairs):
        while True:
            try:
                fd = os.open(path, os.O_RDONLY)
                break
            except FileNotFoundError:
                if _host_gone(control):
                    return 5
        h, n, synced = hashlib.sha256(), 0, 0
        while n < size:
            b = os.read(fd, min(4 * CHUNK, size - n))
            if b:
                h.update(b)
                n += len(b)
                if n - synced >= SYNC_EVERY:
                    os.fdatasync(fd)
                    synced = n
            elif _host_gone(control):
                os.close(fd)
                return 5
        longer = os.fstat(fd).st_size > size
        os.fsync(fd)
        os.close(fd)
        out.write(json.dumps({"index": i, "digest": "long" if longer else h.hexdigest()}) + "\n")
        out.flush()
    return 0


def stdin_bytes() -> BinaryIO:
    _widen_pipe(0)
    return open(0, "rb", buffering=0, closefd=False)


def untar_parts(store: str, wanted: set[str], inp: BinaryIO) -> list[str]:
    """A tar stream of ``<sha>.part`` members (regular files, wanted shas only) unpacked into the store."""
    got = []
    try:
        with tarfile.open(fileobj=inp, mode="r|") as tar:
            for member in tar:
                sha = member.name[:-len(".part")] if member.name.endswith(".part") else ""
                if not member.isreg() or sha not in wanted:
                    raise StoreError(f"the upload stream holds {member.name!r}, not a part of this push")
                src = tar.extractfile(member)
                assert src is not None  # a regular member
                try:
                    with open(os.path.join(store, member.name), "wb") as out:
                        shutil.copyfileobj(src, out, CHUNK)
                except OSError as exc:
                    raise StoreError(f"unpacking {member.name} into {store} failed: {exc.strerror or exc}") from None
                got.append(sha)
    except tarfile.TarError as exc:
        raise StoreError(f"the upload stream is not a whole tar ({exc})") from None
    return got


def _durable(store: str, parts: list[str]) -> None:
    """Every part on disk before any gets its final name: one syncfs(2) of the store's filesystem, not an fsync
    per blob (a release has dozens of small blobs; each fsync is a journal commit eight boards' uploads wait on)."""
    fd = os.open(store, os.O_RDONLY)
    try:
        if ctypes.CDLL(None, use_errno=True).syncfs(fd) == 0:
            return
    except (OSError, AttributeError):
        pass
    finally:
        os.close(fd)
    for part in parts:  # no syncfs here: each file on its own
        pfd = os.open(part, os.O_RDONLY)
        try:
            os.fsync(pfd)
        finally:
            os.close(pfd)


def place_parts(store: str, modes: dict[str, int]) -> dict[str, Any]:
    """Each uploaded ``<sha>.part`` hashed; the good ones made durable and renamed into place with their mode (rename
    is atomic), the bad ones deleted. ``placed``: shas now in the store; ``bad``: sha → the digest it had (or
    "missing")."""
    good: list[str] = []
    bad: dict[str, str] = {}
    for sha in modes:
        part = os.path.join(store, check_sha(sha) + ".part")
        try:
            digest = hash_file(part, flush=False)
        except OSError:
            bad[sha] = "missing"
            continue
        if digest == sha:
            good.append(sha)
        else:
            os.unlink(part)
            bad[sha] = digest
    if good:
        _durable(store, [os.path.join(store, sha + ".part") for sha in good])
    for sha in good:
        part = os.path.join(store, sha + ".part")
        os.chmod(part, modes[sha])
        os.replace(part, os.path.join(store, sha))
    dfd = os.open(store, os.O_RDONLY)
    try:
        os.fsync(dfd)  # the renames, durable
    finally:
        os.close(dfd)
    return {"placed": good, "bad": bad}
