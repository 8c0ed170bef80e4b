"""`agent site-pull SPEC`: take a release's missing blobs from the site's other boards, over HTTP, with aria2c.
The fleet's playbook runs this file as ``python3 -c <source> -``, the spec on stdin.

SPEC (JSON, written by the workstation over SSH, the only thing trusted here):
    {"store": "<base>/store", "staging": "<base>/site/staging",
     "blobs": [{"sha256": "…", "size": N, "executable": false}, …],
     "sources": ["http://10.0.0.5:8089", …]}      # in order: the seed, then boards that already have it

For each blob the store lacks, each source in turn: ``aria2c -c --checksum=sha-256=…`` into staging (a cut
transfer resumes from what landed, from the next source too), then this board's own sha256 of the file — the
gate: a source is only transport, and bytes that do not hash to what the workstation said are deleted and the
next source tried. A verified blob is fsynced and renamed into the store, as a push lands it. Prints one JSON
object: per blob where it came from (or null: the workstation sends it) and the bytes taken.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from typing import Any

CHECKSUM_FAILED = 32  # aria2c's exit status when the download does not match --checksum


def sha256_of(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _aria2c(url: str, staging: str, sha: str, timeout_s: float) -> tuple[int, str]:
    argv = ["aria2c", "-c", "-q", f"--checksum=sha-256={sha}", f"--dir={staging}", f"--out={sha}",
            "--allow-overwrite=true", "--auto-file-renaming=false", "--file-allocation=none",
            "--max-tries=2", "--retry-wait=1", "--connect-timeout=5", "--timeout=10",
            "--max-connection-per-server=1", "--split=1", f"{url.rstrip('/')}/{sha}"]
    try:
        res = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        return 124, "timed out"
    return res.returncode, (res.stderr or res.stdout).strip()[-300:]


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
        before = os.path.getsize(part) if os.path.isfile(part) else 0
        t0 = time.monotonic()
        rc, why = _aria2c(url, staging, sha, timeout_s=max(60.0, size / 1e6))  # ≥ 1 MB/s or give up on it
        got = (os.path.getsize(part) if os.path.isfile(part) else 0) - before
        ok = rc == 0 and os.path.isfile(part) and sha256_of(part) == sha  # our own check, whatever aria2c says
        tries.append({"source": url, "exit": rc, "ok": ok, "seconds": round(time.monotonic() - t0, 3),
                      **({"error": why} if rc and why else {})})
        if ok:
            _land(part, final, bool(blob.get("executable")))
            return {"sha256": sha, "source": url, "bytes": max(got, 0), "tries": tries}
        if rc == CHECKSUM_FAILED or rc == 0:  # wrong bytes (a poisoned or damaged copy): none of it is kept
            for leftover in (part, part + ".aria2"):
                if os.path.exists(leftover):
                    os.remove(leftover)
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
    os.makedirs(spec["staging"], exist_ok=True)
    os.makedirs(spec["store"], exist_ok=True)
    start = time.monotonic()
    done = [pull_one(b, spec["store"], spec["staging"], list(spec["sources"])) for b in spec["blobs"]]
    print(json.dumps({"blobs": done, "seconds": round(time.monotonic() - start, 3)}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "-"))
