"""Install and drive the llama-server unit on a board through systemctl (sudo -n when not root)."""

from __future__ import annotations

from edgekit.errors import EdgekitError
from edgekit.remote.runner import LocalRunner, Result, SshRunner

Runner = SshRunner | LocalRunner

# "$1" unit file to install, "$2" unit name. EDGEKIT_BOARD_ROOT is empty on a real board.
# "$1" the unit file, "$2" the unit's name, then files to take instead while "$1" is missing (the same unit under
# an older name, in a release an older edgekit made).
INSTALL_UNIT_SH = r"""
set -eu
dir="${EDGEKIT_BOARD_ROOT:-}/etc/systemd/system"
src="$1"; unit="$2"; shift 2
for alt in "$@"; do [ -f "$src" ] && break; src="$alt"; done
mkdir -p "$dir"
cp "$src" "$dir/.$unit.new"
chmod 0644 "$dir/.$unit.new"
mv -f "$dir/.$unit.new" "$dir/$unit"
"""


class Service:
    def __init__(self, runner: Runner, unit: str, need_sudo: bool) -> None:
        self.runner, self.unit, self.need_sudo = runner, unit, need_sudo

    def _priv(self, argv: list[str]) -> list[str]:
        return ["sudo", "-n", *argv] if self.need_sudo else argv

    def _run(self, argv: list[str], check: bool = True, timeout: float = 60) -> Result:
        res = self.runner.run(self._priv(argv), check=False, timeout=timeout)
        if self.need_sudo and not res.ok and "password is required" in res.stderr:
            raise EdgekitError(
                f"sudo on board {self.runner.name!r} needs a password; allow `systemctl` and unit installs "
                "without one (NOPASSWD) for the deploy user, or deploy as root."
            )
        if check and not res.ok:
            tail = (res.stderr or res.stdout).strip().splitlines()[-1:] or ["no output"]
            raise EdgekitError(f"systemctl on board {self.runner.name!r} failed: {tail[0]}")
        return res

    def install(self, unit_file: str) -> None:
        """Copy ``unit_file`` (a path on the board) into the unit directory and reload systemd."""
        self._run(["sh", "-c", INSTALL_UNIT_SH, "edgekit-unit", unit_file, self.unit])
        self._run(["systemctl", "daemon-reload"])

    def restart(self) -> None:
        self._run(["systemctl", "enable", self.unit], check=False)
        self._run(["systemctl", "restart", self.unit])

    def stop(self) -> None:
        self._run(["systemctl", "stop", self.unit], check=False)

    def is_active(self) -> bool:
        return self._run(["systemctl", "is-active", "--quiet", self.unit], check=False).exit_code == 0

    def remove(self) -> None:
        self.stop()
        self._run(["systemctl", "disable", self.unit], check=False)
        self._run(["sh", "-c", 'rm -f "${EDGEKIT_BOARD_ROOT:-}/etc/systemd/system/$1"', "edgekit-rm", self.unit],
                  check=False)


def log_tail(runner: Runner, log_file: str, lines: int = 20) -> str:
    res = runner.run(["tail", "-n", str(lines), log_file], check=False, timeout=30)
    return res.stdout.strip()
