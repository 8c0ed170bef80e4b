"""What a board of a site needs to serve its store to its neighbours (edgekit.fleet.sites runs nginx as a job):

    site-hold STORE DIR SHA...   hard links of those blobs in DIR: the board's own activation in the playbook
                                 prunes store blobs no release links, and the site's other boards still need them
    site-nginx BASE              the board's nginx (on the PATH, else where Debian and Ubuntu put it, as /usr/sbin
                                 is not on every login's PATH), and the servers an earlier rollout left (their
                                 run dirs: BASE/site/http-*)

Standard library only (Python 3.8).
"""

from __future__ import annotations

import glob
import os
import shutil
from typing import Any

NGINX_FALLBACK = "/usr/sbin/nginx"


def hold(store: str, hold_dir: str, shas: list[str]) -> dict[str, Any]:
    os.makedirs(hold_dir, exist_ok=True)
    for sha in shas:
        target = os.path.join(hold_dir, sha)
        if os.path.lexists(target):
            os.unlink(target)
        os.link(os.path.join(store, sha), target)
    return {"held": len(shas)}


def nginx(base: str) -> dict[str, Any]:
    found = shutil.which("nginx") or (NGINX_FALLBACK if os.access(NGINX_FALLBACK, os.X_OK) else None)
    runs = sorted(d for d in glob.glob(os.path.join(glob.escape(base), "site", "http-*")) if os.path.isdir(d))
    return {"nginx": found, "runs": runs}
