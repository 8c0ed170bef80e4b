"""The board's systemd units, installed the one way a unit comes to exist on a board: from a spec (unitspec.py),
rendered by the root helper where `edgekit board setup --apply` installed it, else here, by the same renderer,
and put in place as root (a root login directly, else through ``sudo -n``). The unit directory is under
``$EDGEKIT_BOARD_ROOT`` (a simulated board's root).

A release carries its units' specs in ``units.json``; a release an earlier edgekit made carries unit text
instead, which is never installed: such a release is redeployed, not rolled back to.

    unit-install --base B --release R --unit U    the release's spec of U, installed (and daemon-reload)
    unit-install --spec FILE                      a spec of its own (the bench's unit)
    unit-remove --unit U                          stopped, disabled, deleted
    unit-state UNIT                               its file's sha256, whether it is active and enabled
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import pwd
import subprocess
from typing import Any

from . import privileged, unitspec

UNITS_FILE = "units.json"  # in a release: its units' specs, by unit name


class OldRelease(ValueError):
    """A release an earlier edgekit made: unit text, no specs."""


def release_specs(base: str, rid: str) -> dict[str, Any]:
    path = os.path.join(base, "releases", rid, UNITS_FILE)
    try:
        with open(path, encoding="utf-8") as fh:
            specs = json.load(fh)
    except FileNotFoundError:
        raise OldRelease(f"release {rid} was made by an earlier edgekit and carries unit text, which edgekit no "
                         "longer installs; redeploy its recipe instead of rolling back to it") from None
    except (OSError, ValueError) as exc:
        raise OldRelease(f"the unit specs of release {rid} cannot be read ({exc})") from None
    if not isinstance(specs, dict):
        raise OldRelease(f"the unit specs of release {rid} are damaged")
    return specs


def release_spec(base: str, rid: str, unit: str) -> dict[str, Any] | None:
    """The release's spec of ``unit``; None when the release has no such unit (a watchdog turned off)."""
    spec = release_specs(base, rid).get(unit)
    return dict(spec) if isinstance(spec, dict) else None


class Units:
    def __init__(self) -> None:
        self.sudo = privileged.prefix_for_this_user()
        self.helper = self.sudo[2:] != []  # [sudo, -n, HELPER], not full sudo's [sudo, -n] or root's []
        self.dir = os.environ.get("EDGEKIT_BOARD_ROOT", "") + "/etc/systemd/system"
        self.me = pwd.getpwuid(os.getuid()).pw_name

    def _run(self, *argv: str, check: bool = True, data: bytes | None = None) -> int:
        proc = subprocess.run([*self.sudo, *argv], stdout=subprocess.DEVNULL, input=data, check=False)
        if check and proc.returncode != 0:
            raise RuntimeError(f"`{' '.join(argv)}` failed (exit {proc.returncode})")
        return proc.returncode

    def install(self, unit: str, spec: dict[str, Any]) -> None:
        """``spec`` rendered and installed as ``unit``, replaced with one rename; daemon-reload."""
        if spec.get("unit") != unit:
            raise RuntimeError(f"the spec given for {unit} is {spec.get('unit')!r}'s")
        if self.helper:
            self._run("unit-install", unit, data=json.dumps(spec).encode())
            return
        try:
            text = unitspec.render(unitspec.check(spec, self.me))
        except unitspec.BadSpec as exc:
            raise RuntimeError(f"the spec of {unit} is refused: {exc}") from None
        tmp = f"{self.dir}/.{unit}.new"
        self._run("mkdir", "-p", self.dir)
        self._run("install", "-m", "0644", "/dev/stdin", tmp, data=text.encode())
        self._run("mv", "-f", tmp, f"{self.dir}/{unit}")
        self._run("systemctl", "daemon-reload")

    def restart(self, unit: str, enable: bool = True) -> None:
        """``enable``: started at boot too (the service, its watchdog); a candidate is not: a power cut during its
        check must not bring it back."""
        if enable:
            self._run("systemctl", "enable", unit, check=False)
        self._run("systemctl", "restart", unit)

    def stop(self, unit: str) -> None:
        self._run("systemctl", "stop", unit, check=False)

    def remove(self, unit: str) -> None:
        if self.helper:
            self._run("unit-remove", unit, check=False)
            return
        if not os.path.lexists(f"{self.dir}/{unit}"):
            return
        self.stop(unit)
        self._run("systemctl", "disable", unit, check=False)
        self._run("rm", "-f", f"{self.dir}/{unit}", check=False)
        self._run("systemctl", "daemon-reload", check=False)

    def claim(self, base: str) -> None:
        """What an earlier edgekit's servers, run as root, left of root's where they write (their logs, the caches
        in their releases) given back to the login user, who runs them now. Only with full sudo; `edgekit board
        setup --apply` does the same once for a board that has the helper."""
        if os.getuid() == 0 or self.helper:
            return
        me = os.getuid()
        for top in (os.path.join(base, d) for d in privileged.SERVER_WRITES):
            for dirpath, dirs, files in os.walk(top):
                if any(os.lstat(os.path.join(dirpath, n)).st_uid != me for n in (*dirs, *files)):
                    self._run("chown", "-R", f"{me}:{os.getgid()}", top, check=False)
                    break

    def active(self, unit: str) -> bool:
        return subprocess.call(["systemctl", "is-active", "--quiet", unit], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL) == 0


def add_install_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--spec", default=None, help="a spec file of its own (JSON)")
    p.add_argument("--base", default=None)
    p.add_argument("--release", default=None)
    p.add_argument("--unit", default=None, help="the unit of the release's units.json to install")


def cmd_install(args: argparse.Namespace) -> dict[str, Any]:
    if args.spec:
        try:
            with open(args.spec, encoding="utf-8") as fh:
                spec = json.load(fh)
        except (OSError, ValueError) as exc:
            raise ValueError(f"cannot read the unit spec {args.spec} ({exc})") from None
    elif args.base and args.release and args.unit:
        spec = release_spec(args.base, args.release, args.unit)
        if spec is None:
            raise ValueError(f"release {args.release} has no unit {args.unit}")
    else:
        raise ValueError("unit-install takes --spec FILE, or --base, --release and --unit")
    if not isinstance(spec, dict) or not isinstance(spec.get("unit"), str):
        raise ValueError("the unit spec names no unit")
    Units().install(spec["unit"], spec)
    return {"unit": spec["unit"], "installed": True}


def cmd_remove(args: argparse.Namespace) -> dict[str, Any]:
    Units().remove(args.unit)
    return {"unit": args.unit, "removed": True}


def state(unit: str) -> dict[str, Any]:
    """The unit file's sha256 (None without one) and whether it is active and enabled. Unit files are
    world-readable and is-active / is-enabled ask nothing of root: no prefix."""
    path = os.path.join(os.environ.get("EDGEKIT_BOARD_ROOT", "") + "/etc/systemd/system", unit)
    try:
        with open(path, "rb") as fh:
            sha = hashlib.sha256(fh.read()).hexdigest()
    except OSError:
        sha = None

    def asks(verb: str) -> bool:
        return subprocess.call(["systemctl", verb, "--quiet", unit], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL) == 0

    return {"unit": unit, "unit_sha256": sha, "active": asks("is-active"), "enabled": asks("is-enabled")}
