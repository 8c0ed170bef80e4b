"""A host llama-server for the tests that serve a converted pair directly (no board): started, healthy, stopped."""

from __future__ import annotations

import os
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from build_helpers import sdist_or_skip

from edgekit.sim.procs import free_port


def host_llama_bin() -> Path:
    """The host CPU build's bin/ (EDGEKIT_LLAMA_BIN: one already built)."""
    if os.environ.get("EDGEKIT_LLAMA_BIN"):
        return Path(os.environ["EDGEKIT_LLAMA_BIN"])
    sdist_or_skip()
    from edgekit.build import host_build_for_tests

    return host_build_for_tests().bin_dir


@contextmanager
def served(bin_dir: Path, target: Path, drafter: Path | None, log: Path, draft_n_max: int = 3,
           verbose: bool = False, ctx: int = 512, parallel: int | None = None,
           flash_attn: str | None = None) -> Iterator[str]:
    """llama-server on loopback with ``target`` (and ``drafter``, draft-mtp); yields its URL. ``verbose`` (-v)
    logs every draft round's candidates; ``flash_attn``: its -fa (default: llama.cpp's auto)."""
    port = free_port()
    argv = [str(bin_dir / "llama-server"), "-m", str(target), "--host", "127.0.0.1", "--port", str(port),
            "-c", str(ctx), "-t", "2", "-ngl", "0", "--no-warmup", *(["-v"] if verbose else []),
            *(["-np", str(parallel), "-lv", "4"] if parallel else []), *(["-fa", flash_attn] if flash_attn else [])]
    if drafter is not None:
        argv += ["-md", str(drafter), "--spec-type", "draft-mtp", "--spec-draft-n-max", str(draft_n_max),
                 "-ngld", "0"]
    with open(log, "wb") as fh:
        proc = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            if proc.poll() is not None:
                raise AssertionError(f"llama-server exited {proc.returncode}: {log.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"llama-server not healthy: {log.read_text()[-2000:]}")
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
