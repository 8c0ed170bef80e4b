"""The patches edgekit carries for its pinned llama.cpp, applied to every tree it builds or converts with.

The series is package data (``edgekit/data/llama.cpp-patches``): ``series`` lists the files in order, each a
``git format-patch`` file whose header says what it does and its ``Upstream-Status:``. A tree is never patched
in place: :func:`apply_series` works on a copy (hard links, a real copy of each file a patch touches), and the
series' content is part of the tree's identity, so of every build key that tree goes into.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from edgekit.errors import EdgekitError
from edgekit.resources import data_path

LIST_FILE = "edgekit-patches.txt"  # beside llama-server in a build's bin/: what the board's llama.cpp carries
_TOUCHED = re.compile(r"^\+\+\+ b/(\S+)", re.MULTILINE)


@dataclass(frozen=True)
class Patch:
    name: str  # the file's stem: 0001-server-per-request-speculative-n-max
    subject: str
    upstream: str  # its Upstream-Status line
    text: bytes

    @property
    def touched(self) -> list[str]:
        """The files (relative to the llama.cpp root) this patch changes."""
        return _TOUCHED.findall(self.text.decode())

    def to_dict(self) -> dict[str, str]:
        return {"name": self.name, "subject": self.subject, "upstream": self.upstream}


def _header(text: str, key: str) -> str:
    """A header field, folded lines joined (``Upstream-Status: Pending (…)\\n  more``)."""
    m = re.search(rf"^{key}:[ \t]*(.*(?:\n(?![A-Za-z-]+:|---|\n).+)*)", text, re.MULTILINE)
    return " ".join(m.group(1).split()) if m else ""


def series(directory: Path | None = None) -> list[Patch]:
    """edgekit's patch series, in order."""
    directory = directory or Path(str(data_path("llama.cpp-patches")))
    names = [ln.strip() for ln in (directory / "series").read_text().splitlines()
             if ln.strip() and not ln.lstrip().startswith("#")]
    out = []
    for name in names:
        text = (directory / name).read_bytes()
        head = text.decode().split("\n---\n", 1)[0]
        subject = _header(head, "Subject").removeprefix("[PATCH]").strip()
        upstream = _header(head, "Upstream-Status")
        if not subject or not upstream:
            raise EdgekitError(f"llama.cpp patch {name} has no Subject or no Upstream-Status line.")
        out.append(Patch(name.removesuffix(".patch"), subject, upstream, text))
    return out


def series_id(patches: list[Patch]) -> str:
    """What the series is, for cache keys: its names and bytes."""
    digest = hashlib.sha256()
    for p in patches:
        digest.update(p.name.encode() + b"\0" + p.text + b"\0")
    return digest.hexdigest()[:16]


def link_tree(src: Path, dest: Path, real: set[str]) -> None:
    """``dest`` as a copy of ``src`` made of hard links (a real copy where ``real`` names the file, and
    wherever the two are on different file systems); ``.git`` is left behind."""
    for top, dirs, files in os.walk(src):
        dirs[:] = [d for d in dirs if d != ".git"]
        rel = Path(top).relative_to(src)
        (dest / rel).mkdir(parents=True, exist_ok=True)
        for d in dirs:  # a symlinked directory is a link here too, not walked
            if (Path(top) / d).is_symlink():
                (dest / rel / d).symlink_to(os.readlink(Path(top) / d))
        dirs[:] = [d for d in dirs if not (Path(top) / d).is_symlink()]
        for f in files:
            s, d = Path(top) / f, dest / rel / f
            if s.is_symlink():
                d.symlink_to(os.readlink(s))
            elif (rel / f).as_posix() in real:
                shutil.copy2(s, d)
            else:
                try:
                    os.link(s, d)
                except OSError:
                    shutil.copy2(s, d)


def _patch(root: Path, patch: Patch, *args: str) -> subprocess.CompletedProcess[str]:
    # --fuzz=0: a hunk applies only where all of its context is (fuzz would let it land in another ref's code)
    argv = ["patch", "-p1", "--batch", "--fuzz=0", "--no-backup-if-mismatch", "--reject-file=-", "-d", str(root),
            *args]
    return subprocess.run(argv, input=patch.text.decode(), capture_output=True, text=True, check=False)


def apply_series(root: Path, patches: list[Patch], where: str) -> dict[str, str]:
    """Apply each patch to the tree at ``root`` (a copy of ``where``); {name: "applied" | "already in the tree"}.

    A patch the tree already has (upstream took it) is recorded as such; one that applies neither way stops
    the build with the patch's name and patch(1)'s first complaint.
    """
    if patches and shutil.which("patch") is None:
        raise EdgekitError("patch is not installed (apt install patch): edgekit applies its llama.cpp patches "
                           "with it.")
    states = {}
    for p in patches:
        if _patch(root, p, "--forward", "--dry-run").returncode == 0:
            done = _patch(root, p, "--forward")
            if done.returncode != 0:
                raise EdgekitError(f"llama.cpp patch {p.name} failed on {where}: {_first_problem(done)}")
            states[p.name] = "applied"
        elif _patch(root, p, "--reverse", "--dry-run").returncode == 0:
            states[p.name] = "already in the tree"
        else:
            raise EdgekitError(
                f"edgekit's llama.cpp patch {p.name} does not apply to {where}: "
                f"{_first_problem(_patch(root, p, '--forward', '--dry-run'))} (the series is written for the "
                "pinned ref: build without --src, or with a tree at that commit, or build this one as it is with "
                "`edgekit build --no-patches`).")
    return states


def _first_problem(proc: subprocess.CompletedProcess[str]) -> str:
    lines = [ln.strip() for ln in (proc.stdout + proc.stderr).splitlines() if ln.strip()]
    bad = [ln for ln in lines if "FAILED" in ln or "can't find" in ln or "malformed" in ln or "rror" in ln]
    return (bad or lines or [f"patch exited {proc.returncode}"])[0]


def list_text(states: dict[str, str]) -> str:
    """The lines of a build's ``edgekit-patches.txt``: ``<name>\\t<state>`` per patch."""
    return "".join(f"{name}\t{state}\n" for name, state in states.items())


def report(states: dict[str, str]) -> list[dict[str, str]]:
    """Each patch a tree carries with its subject and upstream status (for manifests and `edgekit build`)."""
    known = {p.name: p for p in series()}
    return [{**(known[n].to_dict() if n in known else {"name": n}), "state": state} for n, state in states.items()]
