"""The agent reaches a board once per version: a zipapp named by its content hash under the board's base.

``<base>/agent/edgekit-agent-<hash>.pyz`` holds edgekit/agent/*.py as the package ``_edgekit_agent`` (and
pyz_main.py as its ``__main__``). Built here in memory, byte for byte the same for the same sources (fixed
timestamps and order), so the name says which agent a board has: one stat on the way in, an upload (to a
temporary name, renamed) only when it is missing. Every board-side step after it is ``python3 <pyz> <verb> ...``.
"""

from __future__ import annotations

import hashlib
import io
import os
import zipfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from edgekit import paths
from edgekit.errors import EdgekitError
from edgekit.remote.runner import Runner

AGENT_SRC = Path(__file__).resolve().parents[1] / "agent"
PACKAGE = "_edgekit_agent"
DIR = "agent"  # under the board's base
PYTHON = "python3"  # the board's own interpreter (JetPack's): 3.8 on JetPack 5
_EPOCH = (1980, 1, 1, 0, 0, 0)  # zip's first representable time: the same bytes on every build


@dataclass(frozen=True)
class AgentApp:
    name: str  # edgekit-agent-<first 16 hex of its sha256>.pyz
    data: bytes

    @property
    def version(self) -> str:
        return self.name.removeprefix("edgekit-agent-").removesuffix(".pyz")


def _member(zf: zipfile.ZipFile, name: str, data: bytes) -> None:
    info = zipfile.ZipInfo(name, _EPOCH)
    info.external_attr = 0o644 << 16
    info.compress_type = zipfile.ZIP_DEFLATED
    zf.writestr(info, data, compresslevel=6)


@lru_cache(maxsize=1)
def app() -> AgentApp:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        _member(zf, "__main__.py", (AGENT_SRC / "pyz_main.py").read_bytes())
        for path in sorted(AGENT_SRC.glob("*.py")):
            if path.name != "pyz_main.py":
                _member(zf, f"{PACKAGE}/{path.name}", path.read_bytes())
    data = buf.getvalue()
    return AgentApp(f"edgekit-agent-{hashlib.sha256(data).hexdigest()[:16]}.pyz", data)


def local_file() -> Path:
    """The zipapp as a file on this machine (for Ansible's put_file), under edgekit's cache, named by its hash."""
    target = paths.cache_dir() / DIR / app().name
    if not target.is_file():
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f"{target.name}.{os.getpid()}.tmp")
        tmp.write_bytes(app().data)
        os.replace(tmp, target)
    return target


def path_on(root: str) -> str:
    """Where this edgekit's agent is (or will be) on a board whose base is ``root`` (absolute)."""
    return f"{root.rstrip('/')}/{DIR}/{app().name}"


def ensure(runner: Runner, root: str) -> str:
    """This edgekit's agent on the board (sent when missing); its path. Remembered per runner, and the probe tells
    what the board holds: at most one ``test -f`` per board."""
    path = path_on(root)
    if path in runner.agents:
        return path
    if not runner.run(["test", "-f", path], check=False, timeout=30).ok:
        _send(runner, path)
    runner.agents.add(path)
    return path


def command(path: str, python: str = PYTHON) -> list[str]:
    """How the board runs the agent at ``path`` (``python``: another interpreter of the board's, such as an
    engine's own, for a verb that asks that Python)."""
    return [python, path]


def argv(path: str, verb: str, *args: str, python: str = PYTHON) -> list[str]:
    return [*command(path, python), verb, *args]


def _send(runner: Runner, path: str) -> None:
    """To a temporary name (the bytes on stdin: no SFTP session, so a fleet's OpenSSH master carries it too), then
    renamed: a cut upload leaves only the temporary name."""
    tmp = f"{path}.{os.getpid()}.tmp"
    steps = ((["mkdir", "-p", "--", os.path.dirname(path)], None), (["dd", f"of={tmp}", "bs=1M", "status=none"],
             app().data), (["mv", "-f", "--", tmp, path], None))
    for cmd, data in steps:
        res = runner.run(cmd, check=False, timeout=120, stdin=data)
        if not res.ok:
            why = (res.stderr.strip().splitlines() or [f"exit {res.exit_code}"])[-1]
            raise EdgekitError(f"Sending edgekit's agent to board {runner.name!r} ({path}) failed: {why}.")
