"""Extract a tar archive without letting a member out of its destination, on every Python edgekit runs on.

tarfile's extraction filters (``filter="tar"`` / ``"data"``) came with Python 3.12 and were backported to 3.11.4
and 3.10.12, but Debian 12's own python3 is 3.11.2 and has none: there ``extractall(filter=...)`` is a
TypeError. Where the filters exist they are used; elsewhere each member is checked here, one at a time (so a
streamed archive works too), with the same refusals: a name outside the destination (after any symlink already
extracted), and for ``data`` also a link that points outside it and device or FIFO members. Set-id and sticky
bits and group/other write are dropped either way.
"""

from __future__ import annotations

import os
import tarfile
from pathlib import Path
from typing import Literal

Filter = Literal["tar", "data"]
# Where filters exist (extract_checked is tested there too), say the member was checked: no deprecation warning.
_checked_already = {"filter": "fully_trusted"} if hasattr(tarfile, "fully_trusted_filter") else {}


def extract_all(tf: tarfile.TarFile, dest: str | Path, how: Filter = "tar") -> None:
    if hasattr(tarfile, "data_filter"):
        tf.extractall(dest, filter=how)
    else:
        extract_checked(tf, dest, how)


def extract_checked(tf: tarfile.TarFile, dest: str | Path, how: Filter = "tar") -> None:
    """The filters' refusals done by hand (used where tarfile has no filters; tested on every Python)."""
    root = os.path.realpath(dest)
    for member in tf:
        member.name = member.name.lstrip("/")
        _inside(root, os.path.join(root, member.name), member.name)
        if how == "data":
            if member.isdev() or member.isfifo():
                raise tarfile.TarError(f"{member.name!r} is a device or FIFO")
            if member.issym() or member.islnk():
                base = os.path.dirname(member.name) if member.issym() else ""
                if os.path.isabs(member.linkname):
                    raise tarfile.TarError(f"{member.name!r} links to an absolute path ({member.linkname})")
                _inside(root, os.path.join(root, base, member.linkname), member.name)
        member.mode &= 0o755  # as both filters: no set-id or sticky bit, no group or other write
        tf.extract(member, root, set_attrs=not member.issym(), **_checked_already)


def _inside(root: str, path: str, name: str) -> None:
    real = os.path.realpath(path)
    if real != root and not real.startswith(root + os.sep):
        raise tarfile.TarError(f"{name!r} would be extracted outside {root}")
