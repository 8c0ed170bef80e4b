"""Before a fleet run: connect to every selected board at once, probe it, and take its deploy lock.

The probe is the run's only fact gathering (the plays gather none). The lock is edgekit's own
(edgekit.remote.lock): held by this process and the playbook it runs, so `edgekit deploy` and a
fleet run never work on one board together; a killed run frees every board once its playbook has
ended (a playbook left running finishes under the locks, never beside a deploy). A board that
cannot be reached, probed or locked is reported with its reason and left out of the run.

Each board gets one SSH connection for the whole run: an OpenSSH master in the fleet's control dir
(edgekit.remote.mux), which edgekit's commands use first and the playbook's plays then reuse.
"""

from __future__ import annotations

import contextlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from edgekit.config.boardfile import Board
from edgekit.errors import EdgekitError
from edgekit.remote import agent_ship, mux
from edgekit.remote.lock import BoardLock
from edgekit.remote.probe import BoardFacts, probe
from edgekit.remote.runner import LocalRunner, SshRunner

Runner = SshRunner | LocalRunner


@dataclass
class Target:
    name: str
    board: Board
    runner: Runner
    facts: BoardFacts
    lock: BoardLock | None = None


@dataclass
class Fleet:
    """The boards of one run: ``targets`` (connected, probed, locked) and ``failed`` (name → reason)."""

    boards: dict[str, Board]
    lock: bool = True
    wait_s: int = 0
    max_workers: int = 16
    targets: dict[str, Target] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)
    phases: dict[str, str] = field(default_factory=dict)  # a failed board's phase when not "connect" (memory, key)
    control: Path | None = None  # the masters' control dir: hand it to run_playbook
    _stack: contextlib.ExitStack = field(default_factory=contextlib.ExitStack, init=False, repr=False)

    def _open(self, name: str) -> Target:
        board = self.boards[name]
        assert self.control is not None
        runner = LocalRunner(name) if board.local else mux.MuxRunner(board, name, self.control)
        try:
            facts = probe(runner, board.base)
            agent_ship.ensure(runner, facts.base)  # every play's board commands can count on edgekit's agent
            target = Target(name, board, runner, facts)
            if self.lock:
                target.lock = BoardLock(runner, facts.base, self.wait_s).__enter__()
            return target
        except BaseException:
            runner.close()
            raise

    def __enter__(self) -> Fleet:
        names = list(self.boards)
        self.control = self._stack.enter_context(mux.control_dir())
        if not names:
            return self
        with ThreadPoolExecutor(max_workers=min(self.max_workers, len(names)), thread_name_prefix="fleet") as pool:
            futures = {n: pool.submit(self._open, n) for n in names}
            for name, fut in futures.items():
                try:
                    self.targets[name] = fut.result()
                except EdgekitError as exc:
                    self.failed[name] = exc.message
                except Exception as exc:  # one board's surprise is that board's failure, not the run's
                    self.failed[name] = f"{type(exc).__name__}: {exc}"
        self.targets = {n: self.targets[n] for n in names if n in self.targets}  # board-file order
        return self

    def lock_fds(self) -> list[int]:
        """What keeps the boards' locks held, for the playbook to inherit (run_playbook's ``hold``): if edgekit
        is killed, each board stays locked until the playbook working on it has ended."""
        return [fd for t in self.targets.values() if t.lock is not None and (fd := t.lock.holder_fd()) is not None]

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        for target in self.targets.values():
            with contextlib.suppress(Exception):
                if target.lock is not None:
                    target.lock.__exit__(None, None, None)
            with contextlib.suppress(Exception):
                target.runner.close()
        self._stack.close()  # the masters, after the locks' sessions have ended
