"""Drive a release's unit on a board through systemctl, with the board's prefix for root (remote/privilege.py)."""

from __future__ import annotations

from collections.abc import Sequence

from edgekit.errors import EdgekitError
from edgekit.remote.runner import LocalRunner, Result, SshRunner

Runner = SshRunner | LocalRunner


class Service:
    def __init__(self, runner: Runner, unit: str, sudo: Sequence[str]) -> None:
        self.runner, self.unit, self.sudo = runner, unit, list(sudo)

    def _run(self, argv: list[str], check: bool = True, timeout: float = 60) -> Result:
        res = self.runner.run([*self.sudo, *argv], check=False, timeout=timeout)
        if self.sudo and not res.ok and "password is required" in res.stderr:
            raise EdgekitError(
                f"sudo on board {self.runner.name!r} needs a password; run `edgekit board setup --board "
                f"{self.runner.name} --apply` once as an admin (it allows edgekit's root helper alone), or deploy "
                "as root."
            )
        if check and not res.ok:
            tail = (res.stderr or res.stdout).strip().splitlines()[-1:] or ["no output"]
            raise EdgekitError(f"systemctl on board {self.runner.name!r} failed: {tail[0]}")
        return res

    def restart(self) -> None:
        self._run(["systemctl", "enable", self.unit], check=False)
        self._run(["systemctl", "restart", self.unit])

    def stop(self) -> None:
        self._run(["systemctl", "stop", self.unit], check=False)

    def is_active(self) -> bool:
        return self._run(["systemctl", "is-active", "--quiet", self.unit], check=False).exit_code == 0


def log_tail(runner: Runner, log_file: str, lines: int = 20) -> str:
    res = runner.run(["tail", "-n", str(lines), log_file], check=False, timeout=30)
    return res.stdout.strip()
