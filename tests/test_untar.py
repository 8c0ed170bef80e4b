"""Extraction on a Python without tarfile's filters (Debian 12's python3 is 3.11.2): the checks done by hand
refuse what the filters refuse, and extract what they let through, from a file or a stream."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import pytest

from edgekit.build.untar import extract_all, extract_checked


def _tar(members: list[tuple[str, str, object]]) -> bytes:
    """(kind, name, data-or-linkname) → a tar: kind file | sym | hard | fifo."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for kind, name, extra in members:
            info = tarfile.TarInfo(name)
            if kind == "file":
                data = str(extra).encode()
                info.size, info.mode = len(data), 0o6777
                tf.addfile(info, io.BytesIO(data))
                continue
            info.type = {"sym": tarfile.SYMTYPE, "hard": tarfile.LNKTYPE, "fifo": tarfile.FIFOTYPE}[kind]
            info.linkname = str(extra)
            tf.addfile(info)
    return buf.getvalue()


GOOD = [("file", "bin/llama-server", "elf"), ("sym", "lib/libggml.so", "libggml.so.1"),
        ("file", "lib/libggml.so.1", "so"), ("hard", "bin/copy", "bin/llama-server")]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("how", ["tar", "data"])
def test_a_good_archive_is_extracted_with_no_set_id_bits(tmp_path: Path, stream: bool, how: str) -> None:
    blob = _tar(GOOD)
    with tarfile.open(fileobj=io.BytesIO(blob), mode="r|" if stream else "r") as tf:
        extract_checked(tf, tmp_path, how)  # type: ignore[arg-type]
    assert (tmp_path / "bin/llama-server").read_text() == "elf" == (tmp_path / "bin/copy").read_text()
    assert os.readlink(tmp_path / "lib/libggml.so") == "libggml.so.1"
    assert (tmp_path / "lib/libggml.so.1").stat().st_mode & 0o7777 == 0o755  # was 0o6777


@pytest.mark.parametrize("how,members", [
    ("tar", [("file", "../escape", "x")]),
    ("tar", [("file", "a/../../escape", "x")]),
    ("tar", [("sym", "out", "/etc"), ("file", "out/passwd", "x")]),  # through a symlink it just made
    ("data", [("sym", "out", "/etc")]),
    ("data", [("sym", "up", "../../x")]),
    ("data", [("hard", "h", "../x")]),
    ("data", [("fifo", "p", "")]),
])
def test_what_the_filters_refuse_is_refused(tmp_path: Path, how: str, members: list) -> None:
    dest = tmp_path / "dest"
    dest.mkdir()
    with tarfile.open(fileobj=io.BytesIO(_tar(members))) as tf, pytest.raises(tarfile.TarError):
        extract_checked(tf, dest, how)  # type: ignore[arg-type]
    assert not (tmp_path / "escape").exists() and not (tmp_path / "x").exists()


def test_a_leading_slash_lands_inside(tmp_path: Path) -> None:
    with tarfile.open(fileobj=io.BytesIO(_tar([("file", "/abs/name", "x")]))) as tf:
        extract_checked(tf, tmp_path)
    assert (tmp_path / "abs/name").read_text() == "x"


def test_extract_all_uses_the_filters_where_python_has_them(tmp_path: Path) -> None:
    with tarfile.open(fileobj=io.BytesIO(_tar([("file", "../escape", "x")]))) as tf, pytest.raises(tarfile.TarError):
        extract_all(tf, tmp_path / "d")
    with tarfile.open(fileobj=io.BytesIO(_tar(GOOD))) as tf:
        extract_all(tf, tmp_path / "ok", "data")
    assert (tmp_path / "ok/bin/llama-server").read_text() == "elf"
