"""`agent site-pull SPEC`: take a release's missing blobs from the site's other boards, over HTTP, with aria2c.
The fleet's playbook runs this file as ``python3 -c <source> -``, the spec on stdin.

SPEC (JSON, written by the workstation over SSH, the only thing trusted here):
    {"store": "<base>/store", "staging": "<base>/site/staging",
     "blobs": [{"sha256": "…", "size": N, "executable": false}, …],
     "sources": ["http://10.0.0.5:8089", …]}      # in order: the seed, then boards that already have it

For each blob the store lacks, each source in turn: ``aria2c --checksum=sha-256=…`` into staging, then this
board's own sha256 of the file — the gate: a source is only transport, and bytes that do not hash to what the
workstation said are deleted and the next source tried. A source is bounded too: aria2c may write no more than
the blob's size (the kernel's file-size limit stops it), a source that redirects (HTTP 3xx: a HEAD before
aria2c, aria2c's log after) is refused, and a source that fails leaves nothing behind (its part file and
aria2c's ``.aria2`` control file are deleted), so each source starts from zero: a cut transfer resumes only from
the same source (aria2c's own retries), never on top of another source's bytes. Staging is emptied (what is
in it, never what a link there points to) before and after the pull. A verified blob is fsynced and renamed
into the store, as a push lands it. Prints one JSON object: per blob where it came from (or null: the
workstation sends it), the bytes taken and each try (``exit``: aria2c's status, null when the source was
refused for a redirect).
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import time
import urllib.parse
from typing import Any

CHECKSUM_FAILED = 32  # aria2c's exit status when the download does not match --checksum
CONTROL_ROOM = 1 << 16  # the file-size limit never goes below this: aria2c's .aria2 control file must fit
REDIRECTING = " - Redirecting to "  # aria2c's NOTICE log line when it follows a 3xx


def sha256_of(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _redirect(url: str) -> str | None:
    """Why ``url`` is refused, when a HEAD of it answers 3xx (http.client never follows one; aria2c would)."""
    parts = urllib.parse.urlsplit(url)
    conn_class = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    conn = conn_class(parts.hostname or "", parts.port, timeout=5)
    try:
        conn.request("HEAD", parts.path or "/")
        res = conn.getresponse()
        if 300 <= res.status < 400:
            return f"redirects (HTTP {res.status} to {res.getheader('Location')}): refused"
    except (OSError, http.client.HTTPException):
        pass  # no answer: aria2c's own try says why
    finally:
        conn.close()
    return None


def _aria2c(url: str, staging: str, sha: str, size: int, timeout_s: float) -> tuple[int | None, str]:
    """aria2c's exit status and, when it failed, why; ``(None, why)`` when the source redirected."""
    refused = _redirect(url)
    if refused:
        return None, refused
    argv = ["aria2c", "-q", "--log=-", "--log-level=notice", f"--checksum=sha-256={sha}", f"--dir={staging}",
            f"--out={sha}", "--allow-overwrite=true", "--auto-file-renaming=false", "--file-allocation=none",
            "--max-tries=2", "--retry-wait=1", "--connect-timeout=5", "--timeout=10",
            "--max-connection-per-server=1", "--split=1", url]
    limit = max(size, CONTROL_ROOM)

    def bounded() -> None:  # in the child: a write past `limit` bytes in any file kills aria2c (SIGXFSZ)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    try:
        res = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False,
                             preexec_fn=bounded)
    except subprocess.TimeoutExpired:
        return 124, "timed out"
    log = res.stdout.splitlines()
    moved = [line.split(REDIRECTING, 1)[1] for line in log if REDIRECTING in line]
    if moved:  # the HEAD was answered otherwise, the GET redirected: refused all the same, whatever arrived
        return None, f"redirected to {moved[0]}: refused"[:300]
    if res.returncode == -signal.SIGXFSZ:
        return res.returncode, f"sent more than the blob's {size} bytes"
    if res.returncode == 0:
        return 0, ""
    errors = [line.strip() for line in log if "errorCode=" in line]
    return res.returncode, (errors[-1] if errors else res.stderr.strip())[-300:]


def _discard(part: str) -> None:
    """A failed source's part file and aria2c's control file for it: the next source starts from nothing."""
    for leftover in (part, part + ".aria2"):
        if os.path.lexists(leftover):
            os.remove(leftover)


def _empty(staging: str) -> None:
    """Delete what is in ``staging``, following no link: a link is removed, never what it points to."""
    if os.path.islink(staging):  # a staging that is a link would have aria2c write (and us clear) elsewhere
        os.unlink(staging)
    os.makedirs(staging, exist_ok=True)
    with os.scandir(staging) as entries:
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path)  # fd-based on Linux: does not follow links inside either
            else:
                os.unlink(entry.path)


def _land(part: str, final: str, executable: bool) -> None:
    os.chmod(part, 0o755 if executable else 0o644)
    fd = os.open(part, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(part, final)


def pull_one(blob: dict[str, Any], store: str, staging: str, sources: list[str]) -> dict[str, Any]:
    sha, size = blob["sha256"], int(blob["size"])
    final = os.path.join(store, sha)
    if os.path.isfile(final):
        return {"sha256": sha, "source": "present", "bytes": 0, "tries": []}
    part = os.path.join(staging, sha)
    tries: list[dict[str, Any]] = []
    for url in sources:
        _discard(part)  # never resume on top of another source's bytes
        t0 = time.monotonic()
        rc, why = _aria2c(f"{url.rstrip('/')}/{sha}", staging, sha, size,
                          timeout_s=max(60.0, size / 1e6))  # ≥ 1 MB/s or give up on it
        got = os.path.getsize(part) if os.path.isfile(part) else 0
        # our own check, whatever aria2c says: the blob's size exactly, and its sha256
        ok = rc == 0 and got == size and sha256_of(part) == sha
        tries.append({"source": url, "exit": rc, "ok": ok, "seconds": round(time.monotonic() - t0, 3),
                      **({"error": why} if why else {})})
        if ok:
            _land(part, final, bool(blob.get("executable")))
            return {"sha256": sha, "source": url, "bytes": got, "tries": tries}
        _discard(part)  # wrong, cut, oversized or redirected: none of this source's bytes are kept
    return {"sha256": sha, "source": None, "bytes": 0, "tries": tries}


def main(spec_path: str) -> int:
    """``-``: the spec on stdin (the fleet's playbook runs this file as ``python3 -c``, the spec handed over)."""
    if spec_path == "-":
        spec = json.load(sys.stdin)
    else:
        with open(spec_path) as fh:
            spec = json.load(fh)
    if shutil.which("aria2c") is None:
        print(json.dumps({"error": "aria2c is not installed on this board (apt install aria2)", "blobs": []}))
        return 3
    staging = spec["staging"]
    _empty(staging)  # what an earlier pull (killed, or from before this bound) left
    os.makedirs(spec["store"], exist_ok=True)
    start = time.monotonic()
    try:
        done = [pull_one(b, spec["store"], staging, list(spec["sources"])) for b in spec["blobs"]]
    finally:
        _empty(staging)
    print(json.dumps({"blobs": done, "seconds": round(time.monotonic() - start, 3)}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "-"))
