"""How edgekit runs a command as root on a board: one prefix per board, and the unit file verbs.

The prefix comes from the probe (``BoardFacts.sudo_prefix``): ``[]`` for a root login; ``[sudo, -n, HELPER]``
where `edgekit board setup --apply` installed the helper (agent/privileged.py, root-owned) and the login user may
run it; else ``[sudo, -n]`` (full passwordless sudo). systemctl, nvpmodel and jetson_clocks are written the same
way for all three (the helper takes them as verbs and checks them); installing and removing a unit differ, so they
are built here only. The unit file is always read by the login user's shell and handed over on stdin: as root,
nothing opens a path the user could point elsewhere.
"""

from __future__ import annotations

from collections.abc import Sequence

from edgekit.agent.privileged import CLOCKS_FILE, HELPER_PATH

# "$1" the unit file, then files to take instead while it is missing (the same unit under an older name, in a
# release an older edgekit made), then "--" and the command that installs what comes on stdin.
FROM_FILE_SH = 'src="$1"; shift; while [ "$1" != -- ]; do [ -f "$src" ] || src="$1"; shift; done; shift; ' \
               'exec "$@" < "$src"'
# As root or with full sudo: "$1" the unit's name, its text on stdin. EDGEKIT_BOARD_ROOT: a simulated board's root.
INSTALL_STDIN_SH = r"""
set -eu
dir="${EDGEKIT_BOARD_ROOT:-}/etc/systemd/system"
mkdir -p "$dir"
cat > "$dir/.$1.new"
chmod 0644 "$dir/.$1.new"
mv -f "$dir/.$1.new" "$dir/$1"
systemctl daemon-reload
"""
REMOVE_SH = r"""
systemctl stop "$1"; systemctl disable "$1" 2>/dev/null
f="${EDGEKIT_BOARD_ROOT:-}/etc/systemd/system/$1"
if [ -e "$f" ]; then rm -f "$f"; systemctl daemon-reload; fi
exit 0
"""


def uses_helper(prefix: Sequence[str]) -> bool:
    return bool(prefix) and str(prefix[-1]).endswith(HELPER_PATH)


def unit_install(prefix: Sequence[str], src: str, unit: str, alternatives: Sequence[str] = ()) -> list[str]:
    """The unit file ``src`` (a path on the board) installed as ``unit``, then daemon-reload."""
    install = ([*prefix, "unit-install", unit] if uses_helper(prefix)
               else [*prefix, "sh", "-c", INSTALL_STDIN_SH, "edgekit-unit", unit])
    return ["sh", "-c", FROM_FILE_SH, "edgekit-unit-file", src, *alternatives, "--", *install]


def unit_remove(prefix: Sequence[str], unit: str) -> list[str]:
    """Stop, disable and delete ``unit``; a missing unit is no error."""
    return ([*prefix, "unit-remove", unit] if uses_helper(prefix)
            else [*prefix, "sh", "-c", REMOVE_SH, "edgekit-rm", unit])


def clocks_file(prefix: Sequence[str], work: str) -> str:
    """Where jetson_clocks stores the clocks to put back: the helper allows one root-owned place only."""
    return CLOCKS_FILE if uses_helper(prefix) else f"{work}/clocks.conf"
