"""Constant board-side programs for transfers. Values only ever arrive as arguments ("$1", argv).

POSIX sh and, when the board has it, python3 standard library: nothing to install on a board.
"""

from __future__ import annotations

# `sh -c INVENTORY sh STORE SHA...`: create the store, then one line per blob the board has
# (`have SHA x|-`: executable or not) or has partly (`part SHA BYTES`), the free space of the
# store's filesystem (`free KB`) and whether python3 is there for the streaming verifier.
# The listing part, shared with the fleet's read-only (--check) inventory.
INVENTORY_LIST_SH = r"""
for s in "$@"; do
  if [ -f "$d/$s" ]; then
    if [ -x "$d/$s" ]; then echo "have $s x"; else echo "have $s -"; fi
  elif [ -f "$d/$s.part" ]; then
    echo "part $s $(wc -c < "$d/$s.part" | tr -d ' ')"
  fi
done
echo "free $(df -Pk -- "$d" | awk 'NR==2 {print $4}')"
"""
INVENTORY_SH = r"""
d="$1"; shift
mkdir -p -- "$d" || exit 3
""" + INVENTORY_LIST_SH + r"""if command -v python3 >/dev/null 2>&1; then echo "python3 yes"; fi
"""

# `sh -c 'printf %s "$HOME"'`: the login's home, to expand a base of ~/...
HOME_SH = 'printf "%s" "$HOME"'

# `python3 -c VERIFY_PY PATH SIZE [PATH SIZE ...]`: hash each file *while it is being uploaded*,
# in upload order, so verification costs no extra pass at the end; fdatasync every 64 MiB so
# the final fsync is short. Prints `INDEX HEX` (or `INDEX long` for a file longer than SIZE).
# Exits as soon as the host closes the channel (stdin EOF): a killed push leaves no process.
# Python >= 3.6 (JetPack 4's python3).
VERIFY_PY = r"""
import hashlib, os, select, sys

def host_gone():
    if select.select([0], [], [], 0.01)[0]:
        return not os.read(0, 1)
    return False

args = sys.argv[1:]
for i in range(0, len(args), 2):
    path, size = args[i], int(args[i + 1])
    while True:
        try:
            fd = os.open(path, os.O_RDONLY)
            break
        except FileNotFoundError:
            if host_gone():
                sys.exit(5)
    h, n, synced = hashlib.sha256(), 0, 0
    while n < size:
        b = os.read(fd, min(4 << 20, size - n))
        if b:
            h.update(b)
            n += len(b)
            if n - synced >= 64 << 20:
                os.fdatasync(fd)
                synced = n
        elif host_gone():
            sys.exit(5)
    longer = os.fstat(fd).st_size > size
    os.fsync(fd)
    os.close(fd)
    print(i // 2, "long" if longer else h.hexdigest(), flush=True)
"""

# `sh -c HASH_SH sh STORE SUFFIX SHA...`: hash each STORE/SHA.part after the upload (SUFFIX ".part"; boards without
# python3) and flush it to disk, or a stored STORE/SHA again (SUFFIX ""). openssl first: it uses the CPU's SHA
# instructions (≈ 6× faster than coreutils sha256sum here). Prints `SHA HEX`.
HASH_SH = r"""
d="$1"; x="$2"; shift 2
if command -v openssl >/dev/null 2>&1; then h() { openssl dgst -sha256 -r "$1"; }
elif command -v sha256sum >/dev/null 2>&1; then h() { sha256sum -- "$1"; }
elif command -v shasum >/dev/null 2>&1; then h() { shasum -a 256 -- "$1"; }
else echo "no sha256 tool (openssl, sha256sum or shasum) on this board" >&2; exit 3
fi
for s in "$@"; do
  f="$d/$s$x"
  out="$(h "$f")" || exit 4
  sync -- "$f" 2>/dev/null || sync
  printf '%s %s\n' "$s" "${out%% *}"
done
"""
