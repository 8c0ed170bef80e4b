"""Files in the bench's work directory on the board: put small files, read them back, clean up.

Each bench gets ``<base>/bench/<session>/`` for the prompt set, the power samples, the bench unit and the jobs'
outputs; it is removed when the bench ends. The agent it runs is this edgekit's zipapp (remote.agent_ship).
"""

from __future__ import annotations

import os
from pathlib import Path

from edgekit.remote.runner import LocalRunner, SshRunner

Runner = SshRunner | LocalRunner


def mkdirs(runner: Runner, path: str) -> None:
    runner.run(["mkdir", "-p", path], timeout=30)


def put_bytes(runner: Runner, path: str, data: bytes, mode: int = 0o644) -> None:
    """Write a small file on the board, complete or not at all (.part + rename)."""
    part = f"{path}.part"
    if isinstance(runner, LocalRunner):
        Path(part).write_bytes(data)
        os.chmod(part, mode)
        os.replace(part, path)
        return
    sftp = runner.sftp()
    with sftp.open(part, "wb") as fh:
        fh.write(data)
    sftp.chmod(part, mode)
    sftp.posix_rename(part, path)


def put_text(runner: Runner, path: str, text: str) -> None:
    put_bytes(runner, path, text.encode("utf-8"))


def read_text(runner: Runner, path: str) -> str | None:
    res = runner.run(["cat", path], check=False, timeout=120)
    return res.stdout if res.ok else None


def remove_tree(runner: Runner, path: str) -> None:
    if "/bench/" not in path and "/site/" not in path:  # only ever a bench or site work dir
        raise ValueError(f"refusing to remove {path!r}")
    runner.run(["rm", "-rf", "--", path], check=False, timeout=120)
    runner.run(["rmdir", "--", path.rsplit("/", 1)[0]], check=False, timeout=30)  # bench/ itself, once empty
