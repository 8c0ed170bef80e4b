"""Board-side programs the Ansible roles run, handed to the playbook in the plan file.

The release layout, the store and the unit install are verbs of edgekit's agent (sent to the board as a zipapp by
the push), called as `edgekit deploy` calls them, so a board updated by Ansible looks exactly like one updated by
`edgekit deploy`; the health check is the one deploy runs too (edgekit/agent/health.py,
its source sent as ``python3 -c``). STATE_PY (the
board's release state as JSON) is the fleet's own. Values only ever arrive as arguments (or on stdin); the roles
quote every argument (Jinja's `quote` = shlex).
"""

from __future__ import annotations

from edgekit.engines import ENGINES, get_engine
from edgekit.release.health import health_program

# `python3 -c STATE_PY BASE [RELEASE] [UNIT [OLDER NAMES]]`: current, serving, releases (oldest first, as
# releases.layout sorts them), those that carry the activation program (programs), the manifests of
# current/previous/RELEASE, whether UNIT (or it under an older name) is active,
# and the sudo prefix edgekit uses (none as root). Python >= 3.6: JetPack 4's python3.
STATE_PY = r"""
import json, os, subprocess, sys

base = os.path.expanduser(sys.argv[1]).rstrip("/") or "/"
want = sys.argv[2] if len(sys.argv) > 2 else ""
unit = sys.argv[3] if len(sys.argv) > 3 else ""
older = sys.argv[4:]
# edgekit's root helper (`edgekit board setup --apply`) where the user may run it: agent/privileged.py's
# prefix_for_this_user, written out (this runs as `python3 -c`, with no agent beside it).
helper = os.environ.get("EDGEKIT_BOARD_ROOT", "") + "/usr/local/sbin/edgekit-root"
if os.getuid() == 0:
    sudo = []
elif os.access(helper, os.X_OK) and subprocess.call(["sudo", "-n", "-l", helper], stdout=subprocess.DEVNULL,
                                                    stderr=subprocess.DEVNULL) == 0:
    sudo = ["sudo", "-n", helper]
else:
    sudo = ["sudo", "-n"]

def text(path):
    try:
        with open(path) as fh:
            return fh.read().strip() or None
    except (OSError, ValueError):
        return None

def manifest(rid):
    if not rid:
        return {}
    try:
        with open(os.path.join(base, "releases", rid, "release.json")) as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return {}
    data.pop("files", None)
    return data

try:
    link = os.readlink(os.path.join(base, "current"))
    current = link[len("releases/"):] if link.startswith("releases/") else link
except OSError:
    current = None
found = []
try:
    for name in os.listdir(os.path.join(base, "releases")):
        path = os.path.join(base, "releases", name)
        if not name.startswith(".") and os.path.isdir(path):
            found.append((int(os.stat(path).st_mtime), name))
except OSError:
    pass
ids = [name for _, name in sorted(found)]
previous = ids[ids.index(current) - 1] if current in ids and ids.index(current) > 0 else None
programs = [r for r in ids if os.path.isfile(os.path.join(base, "releases", r, "agent", "activate.py"))]
active = False
for name in ([unit] + older) if unit else []:
    try:
        active = active or subprocess.call(sudo + ["systemctl", "is-active", "--quiet", name],
                                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) == 0
    except OSError:
        pass
print(json.dumps({
    "base": base, "current": current, "serving": text(os.path.join(base, "serving")), "releases": ids,
    "previous": previous, "has_release": bool(want) and want in ids, "active": active, "sudo": sudo,
    "programs": programs,
    "board_root": os.environ.get("EDGEKIT_BOARD_ROOT", ""),
    "manifests": {"current": manifest(current), "previous": manifest(previous), "release": manifest(want)},
}))
"""

def scripts() -> dict[str, str]:
    """Every board-side program the roles use, by the name the roles know it by."""
    return {
        "state": STATE_PY,
        "health": health_program(),
    }


def health_apis() -> dict[str, str]:
    """Each engine's health dialect (agent/health.py --api), for the roles: they know a release's engine by name
    from its release.json, and Ansible's workers do not import the engines."""
    return {name: get_engine(name).health_api for name in ENGINES}
