"""Run one of edgekit's playbooks (edgekit/data/ansible/playbooks/*.yml) with ansible-playbook, and read its report.

Each run gets its own directory: the rendered inventory, the plan (extra vars), the report the
`edgekit_report` callback writes, and the collections path that makes the package's content the
`edgekit.fleet` collection the plays call by name. The SSH control sockets (ControlMaster/ControlPersist)
are the fleet's when edgekit opened the boards' masters before the run (edgekit.remote.mux), else a dir of
the run's own whose masters are told to exit when it ends.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from edgekit import optional
from edgekit.errors import EdgekitError
from edgekit.paths import cache_dir
from edgekit.remote import mux
from edgekit.resources import ansible_collection_dir

SUPPORTED_SERIES = "2.19"  # serves JetPack 5 (Python 3.8) and JetPack 6/7 boards; 2.20+ refuses 3.8
Batch = int | str


def ansible_dir() -> Path:
    """The Ansible content edgekit ships in its package (the `edgekit.fleet` collection)."""
    path = ansible_collection_dir()
    if not (path / "playbooks").is_dir():
        raise EdgekitError(f"edgekit's Ansible playbooks are missing from {path}: this edgekit install is "
                           "incomplete; reinstall it from its checkout or wheel.")
    return path


def ansible_version() -> str:
    try:
        from ansible.release import __version__
    except ImportError:
        raise optional.refusal("edgekit fleet", optional.extra("fleet", only={"ansible-core"})) from None
    return str(__version__)


def preflight(warn: Callable[[str], None]) -> None:
    """Fail early (before any board is touched) without ansible-core or the playbooks; warn off 2.19."""
    version = ansible_version()
    ansible_dir()
    playbook_command()
    if not version.startswith(SUPPORTED_SERIES + "."):
        warn(f"ansible-core {version} is installed; edgekit is tested with {SUPPORTED_SERIES}.x, and 2.20+ cannot "
             "manage JetPack 5 (Python 3.8) boards.")


def playbook_command() -> str:
    beside = Path(sys.executable).with_name("ansible-playbook")  # the venv edgekit runs in
    found = str(beside) if beside.is_file() else shutil.which("ansible-playbook")
    if not found:
        command = optional.install_command(optional.extra("fleet", only={"ansible-core"}).requirements)
        raise EdgekitError(f"ansible-playbook was not found beside this Python or on PATH (edgekit fleet runs it: "
                           f"ansible-core, edgekit's fleet extra); run: {command}")
    return found


def parse_batches(text: str) -> list[Batch]:
    """'1,25%,100%' → [1, '25%', '100%'] (Ansible's `serial` list)."""
    out: list[Batch] = []
    for part in (p.strip() for p in text.split(",")):
        if part.endswith("%") and part[:-1].isdigit() and 0 < int(part[:-1]) <= 100:
            out.append(part)
        elif part.isdigit() and int(part) > 0:
            out.append(int(part))
        else:
            raise EdgekitError(f"Batch {part!r} is not a board count (e.g. 2) or a percentage (e.g. 25%).")
    if not out:
        raise EdgekitError("--batch needs at least one size, e.g. 1,25%,100%.")
    return out


def largest_batch(batches: Sequence[Batch], hosts: int) -> int:
    """The most boards one batch holds (as Ansible computes it), so forks can cover a whole batch."""
    sizes = []
    for b in batches:
        n = (math.floor(int(b[:-1]) / 100 * hosts) or 1) if isinstance(b, str) else b
        sizes.append(min(max(n, 1), max(hosts, 1)))
    return max(sizes or [1])


# --------------------------------------------------------------------------------- plan file


def _unsafe(value: Any) -> Any:
    """Every string value wrapped as ``{"__ansible_unsafe": ...}``: Ansible must never template a path, id or
    script. JSON, not YAML: Ansible reads a JSON vars file with its JSON decoder (the same untrusted strings
    as YAML's ``!unsafe``): an 8-board plan (100 KB) loads in 14 ms instead of 48 ms, and edgekit writes it
    in 1 ms instead of 41 ms, on the core the run's other work waits for."""
    if isinstance(value, dict):
        return {str(k): _unsafe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_unsafe(v) for v in value]
    if isinstance(value, str):
        return {"__ansible_unsafe": value}
    return value


def dump_vars(data: dict[str, Any]) -> str:
    return json.dumps(_unsafe(data), ensure_ascii=False, separators=(",", ":"))


# ------------------------------------------------------------------------------------- running


def _follow(log: Path, proc: subprocess.Popen[bytes], on_line: Callable[[str], None] | None) -> None:
    """Hand each line the playbook writes to ``log`` to ``on_line`` as it comes, until the playbook ends."""
    if on_line is None:
        return
    with open(log, encoding="utf-8", errors="replace", newline="") as fh:
        partial = ""
        while True:
            ended = proc.poll() is not None  # before the read: what it wrote before ending is read below
            chunk = fh.read()
            lines = (partial + chunk).split("\n")
            partial = lines.pop()
            for line in lines:
                on_line(line.rstrip("\r"))
            if ended:
                if partial:
                    on_line(partial)
                return
            if not chunk:
                time.sleep(0.02)


def collections_path(where: Path, root: Path) -> Path:
    """A collections path whose only collection is the package's own ``edgekit.fleet`` (``root``): the plays
    call its roles and plugins by their FQCNs, as a fleet owner's playbook does with the installed collection,
    so both run the same content, and another edgekit.fleet installed elsewhere is never the one used."""
    link = where / "ansible_collections" / "edgekit" / "fleet"
    link.parent.mkdir(parents=True)
    link.symlink_to(root, target_is_directory=True)
    return where


@dataclass
class PlaybookRun:
    playbook: str
    rc: int
    seconds: float
    report: dict[str, Any] = field(default_factory=dict)
    log: Path | None = None


def run_playbook(
    playbook: str,
    inventory: dict[str, Any],
    extra_vars: dict[str, Any],
    limit: Sequence[str],
    *,
    forks: int = 5,
    check: bool = False,
    on_line: Callable[[str], None] | None = None,
    color: bool = False,
    control: Path | None = None,
    hold: Sequence[int] = (),
) -> PlaybookRun:
    """``ansible-playbook <playbook> -i <inventory> -e @<plan> --limit <boards>``; never raises for a board.

    ``control``: the control dir whose SSH masters the plays use (the fleet's, opened by edgekit before
    the run, closed by its owner); None: a dir of the run's own. ``hold``: descriptors the playbook inherits
    and keeps open while it runs (the boards' locks, Fleet.lock_fds).
    """
    ansible_version()
    root = ansible_dir()
    log_dir = cache_dir() / "fleet"
    log_dir.mkdir(parents=True, exist_ok=True)
    log = log_dir / f"{Path(playbook).stem}.log"
    work = Path(tempfile.mkdtemp(prefix="edgekit-fleet-"))
    own = contextlib.ExitStack()  # the run's own control dir, when the caller has none
    try:
        if control is None:
            control = own.enter_context(mux.control_dir())
        (work / "inventory.yml").write_text(yaml.safe_dump(inventory, sort_keys=False))
        plan = work / "plan.json"
        plan.write_text(dump_vars(extra_vars))
        plan.chmod(0o600)
        (work / "tmp").mkdir()
        collections = collections_path(work / "collections", root)
        argv = [playbook_command(), str(root / "playbooks" / playbook), "-i", str(work / "inventory.yml"),
                "-e", f"@{plan}", "--limit", ",".join(limit), "--forks", str(max(1, forks))]
        if check:
            argv.append("--check")
        env = {**os.environ, "ANSIBLE_CONFIG": str(root / "ansible.cfg"), "ANSIBLE_COLLECTIONS_PATH": str(collections),
               "ANSIBLE_SSH_CONTROL_PATH_DIR": str(control), "ANSIBLE_LOCAL_TEMP": str(work / "tmp"),
               "EDGEKIT_FLEET_REPORT": str(work / "report.json"), "ANSIBLE_FORCE_COLOR": "1" if color else "0",
               "ANSIBLE_NOCOLOR": "0" if color else "1", "PYTHONUNBUFFERED": "1"}
        start = time.monotonic()
        # The output goes to a file of the run's, not through a pipe of ours: if edgekit is killed, the playbook
        # must not die at its next line (a board left between two tasks); with ``hold`` it keeps the locks until
        # it ends. The run's own file, so two runs at once each follow theirs; the last one is kept as ``log``.
        live = work / "playbook.log"
        with open(live, "w") as out:
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env=env, cwd=root, pass_fds=tuple(hold))
        try:
            _follow(live, proc, on_line)
        finally:
            proc.wait()  # also on Ctrl-C, which reached the playbook too: it ends its own way
            shutil.copyfile(live, log)
        seconds = time.monotonic() - start
        if os.environ.get("EDGEKIT_FLEET_KEEP"):  # debugging: keep the inventory and plan to rerun by hand
            keep = Path(os.environ["EDGEKIT_FLEET_KEEP"])
            keep.mkdir(parents=True, exist_ok=True)
            for name in ("inventory.yml", "plan.json"):
                shutil.copy(work / name, keep / name)
        report_file = work / "report.json"
        report = json.loads(report_file.read_text()) if report_file.is_file() else {}
        if not report and proc.returncode != 0:
            tail = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()][-3:]
            raise EdgekitError(f"ansible-playbook {playbook} failed before any board ran "
                               f"(exit {proc.returncode}): {' / '.join(tail)[-600:]} (log: {log}).")
        return PlaybookRun(playbook, proc.returncode, round(seconds, 2), report, log)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        own.close()
