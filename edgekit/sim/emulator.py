"""Start a program (a sim board's sshd) where aarch64 ELF files run under qemu-user, as on a Jetson.

    python emulator.py --qemu /usr/bin/qemu-aarch64 -- /usr/sbin/sshd -f CFG -D -e

The process enters a user + mount namespace of its own, mounts a binfmt_misc instance there (Linux
≥ 6.7 gives each user namespace its own) and registers qemu-aarch64 for aarch64 ELF files, then
execs the program: its pid is this process's pid. Everything that program starts — ssh sessions,
services, the binaries of a release — runs aarch64 executables through the kernel's exec, so the
board runs the very bytes a Jetson gets, by the same paths. The host's binfmt table is not touched.

User ids are mapped to themselves (all of them when run as root, so sshd's privilege separation
works), so files look the same inside and out. Stdlib only: run by path, without importing edgekit.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import sys

CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
MS_REC = 0x4000
MS_PRIVATE = 1 << 18
BINFMT_DIR = "/proc/sys/fs/binfmt_misc"
HANDLER = "edgekit-aarch64"
# e_ident (64-bit, little-endian, version 1), e_type EXEC or DYN, e_machine EM_AARCH64 (183):
# the same magic and mask Debian's qemu-user-binfmt registers.
MAGIC = r"\x7fELF\x02\x01\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x02\x00\xb7\x00"
MASK = r"\xff\xff\xff\xff\xff\xff\xff\x00\xff\xff\xff\xff\xff\xff\xff\xff\xfe\xff\xff\xff"


class EmulatorError(Exception):
    pass


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _check(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise EmulatorError(f"{what} failed: {os.strerror(err)}")


def identity_map(path: str) -> str:
    """Our own id ranges mapped to themselves in the new namespace."""
    if os.geteuid() != 0:
        return f"{os.geteuid() if 'uid' in path else os.getegid()} " * 2 + "1\n"
    with open(path) as fh:
        rows = [line.split() for line in fh if line.strip()]
    return "".join(f"{inside} {inside} {count}\n" for inside, _outside, count in rows)


def _write(path: str, text: str) -> None:
    with open(path, "w") as fh:
        fh.write(text)


def enter_namespaces() -> None:
    """unshare(user + mount); a helper left outside writes our id maps (a process cannot map
    more than its own id from inside)."""
    uid_map, gid_map = identity_map("/proc/self/uid_map"), identity_map("/proc/self/gid_map")
    ready_r, ready_w = os.pipe()
    done_r, done_w = os.pipe()
    me = os.getpid()
    helper = os.fork()
    if helper == 0:  # outside: wait for the unshare, write the maps, report, leave
        os.close(ready_w)
        os.close(done_r)
        status = b"ok"
        try:
            if os.read(ready_r, 2) == b"go":
                if os.geteuid() != 0:
                    _write(f"/proc/{me}/setgroups", "deny")  # required before an unprivileged gid_map
                _write(f"/proc/{me}/uid_map", uid_map)
                _write(f"/proc/{me}/gid_map", gid_map)
            else:
                status = b"no"
        except OSError as exc:
            status = f"id maps: {exc.strerror}".encode()
        os.write(done_w, status)
        os._exit(0)
    os.close(ready_r)
    os.close(done_w)
    libc = _libc()
    rc = libc.unshare(CLONE_NEWUSER | CLONE_NEWNS)
    err = ctypes.get_errno()
    os.write(ready_w, b"go" if rc == 0 else b"no")
    status = os.read(done_r, 200)
    os.waitpid(helper, 0)
    if rc != 0:
        raise EmulatorError(f"user namespaces are not available here (unshare: {os.strerror(err)})")
    if status != b"ok":
        raise EmulatorError(status.decode(errors="replace"))


def register_qemu(qemu: str) -> None:
    libc = _libc()
    # Our mounts stay ours: nothing propagates back to the host's mount table.
    _check(libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "making / private")
    _check(libc.mount(b"binfmt_misc", BINFMT_DIR.encode(), b"binfmt_misc", 0, None),
           f"mounting binfmt_misc (needs Linux 6.7 or newer; this is {os.uname().release})")
    # F: the kernel opens qemu now, so it is found whatever mount namespace a program runs in.
    _write(f"{BINFMT_DIR}/register", f":{HANDLER}:M::{MAGIC}:{MASK}:{qemu}:F")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--qemu", required=True, help="qemu-aarch64 (user mode)")
    ap.add_argument("--check", action="store_true", help="only test that this machine can do it")
    ap.add_argument("program", nargs=argparse.REMAINDER)
    args = ap.parse_args(argv)
    program = args.program[1:] if args.program[:1] == ["--"] else args.program
    try:
        enter_namespaces()
        register_qemu(args.qemu)
    except (EmulatorError, OSError) as exc:
        print(f"emulator: {exc}", file=sys.stderr)
        sys.exit(3)
    if args.check:
        return
    if not program:
        ap.error("no program to run")
    os.execvp(program[0], program)


if __name__ == "__main__":
    main()
