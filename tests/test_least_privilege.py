"""Least privilege on a board: its login user may run edgekit's root helper and nothing else as root, and deploy,
bench, rollback and the fleet's rollout all work; the servers run as that user, not as root.

A simulated board made to log in as an unprivileged account of this machine (its root stays root's); the sudo is
this machine's. The admin's part is played as on a real board: the user has full sudo while `edgekit board setup
--apply` runs, then loses it.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import yaml
from build_helpers import sdist_or_skip
from cli_helpers import edgekit, ok_json
from conftest import SimSession

from edgekit.agent.privileged import HELPER_PATH, REFUSED
from edgekit.sim.testing import SimBoard

USER = "edgekit-lp"
FULL_SUDO = Path("/etc/sudoers.d/zz-edgekit-test-full")  # the admin's grant while setting up, taken back after
RECIPE = "sim-tiny-mtp"

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("sudo"),
                                reason="making a user and its sudoers needs root and sudo (.ci/install)")


@pytest.fixture
def board() -> Iterator[tuple[SimBoard, dict[str, str]]]:
    try:
        pwd.getpwnam(USER)
    except KeyError:
        subprocess.run(["useradd", "--create-home", "--shell", "/bin/sh", USER], check=True)
    # No password, but not locked ("!"): sshd without PAM refuses a locked account even its key.
    subprocess.run(["usermod", "-p", "*", USER], check=True)
    # Its own sim dir, where the user can reach it (pytest's tmp dirs are 0700).
    top = Path(tempfile.mkdtemp(prefix="edgekit-lp-"))
    top.chmod(0o711)
    session = SimSession(top)
    env = {**os.environ, **session.env, "EDGEKIT_LLAMA_SRC": str(sdist_or_skip())}
    sudoers = Path(f"/etc/sudoers.d/edgekit-{USER}")
    try:
        (b,) = session.boards(1)
        moved = edgekit("--json", "sim", "login-as", b.name, USER, env=env, timeout=900)
        assert moved.returncode == 0 and json.loads(moved.stdout)["user"] == USER, moved.stderr
        b = SimBoard(**{**b.__dict__, "user": USER})
        yield b, env
    finally:
        session.down()
        for f in (FULL_SUDO, sudoers):
            f.unlink(missing_ok=True)
        shutil.rmtree(top, ignore_errors=True)


def servers_of(base: Path) -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter(["cmdline", "username"]):
        cmd = p.info["cmdline"] or []
        if cmd and cmd[0].endswith("/bin/llama-server") and cmd[0].startswith(str(base)):
            out.append(p)
    return out


def test_a_board_whose_user_may_run_only_the_helper_deploys_benches_rolls_back_and_rolls_out(board) -> None:
    b, env = board
    helper = f"{b.root}{HELPER_PATH}"

    # What an admin is shown: one sudoers line for the helper alone.
    shown = edgekit("board", "setup", "--board", b.name, env=env, timeout=900)
    assert shown.returncode == 0, shown.stderr
    assert f"{USER} ALL=(root) NOPASSWD: {helper}" in shown.stdout

    # Applying needs root or full sudo once: refused without it, in one sentence, nothing installed.
    refused = edgekit("board", "setup", "--board", b.name, "--apply", env=env, timeout=900)
    assert refused.returncode != 0 and "needs root or passwordless sudo" in refused.stderr
    assert not Path(helper).exists()
    FULL_SUDO.write_text(f"{USER} ALL=(root) NOPASSWD: ALL\n")
    FULL_SUDO.chmod(0o440)
    applied = ok_json(edgekit("--json", "board", "setup", "--board", b.name, "--apply", env=env, timeout=900))
    assert applied["applied"] and applied["sudo"] == "helper" and applied["helper"] == helper
    assert "(there now: current)" in edgekit("board", "setup", "--board", b.name, env=env, timeout=900).stdout
    st = os.stat(helper)
    assert (st.st_uid, st.st_mode & 0o777) == (0, 0o755)
    FULL_SUDO.unlink()  # the admin takes the rest away
    assert ok_json(edgekit("--json", "board", "probe", "--board", b.name, env=env, timeout=900))["sudo"] == "helper"

    # The user can do nothing else as root: no other sudo, no other helper verb, no unit of its own shape.
    assert b.run("sudo -n true").rc != 0
    assert b.run(f"sudo -n {helper} systemctl restart ssh.service").rc == REFUSED
    assert b.run(f"sudo -n {helper} nvpmodel -m 0; echo").rc == 0  # an allowed verb (the sim's stand-in)
    # Unit text is never taken, whatever it says; a spec only for the user itself, under its own base.
    evil = "[Service]\nExecStart=/bin/sh -c id\nUser=root\n"
    assert b.run(f"printf '{evil}' | sudo -n {helper} unit-install edgekit-evil.service").rc == REFUSED
    spec = json.dumps({"unit": "edgekit-evil.service", "role": "server", "base": str(b.base), "release": "r",
                       "argv": ["/bin/sh"], "log": "/etc/passwd", "user": USER})
    leak = b.run(f"printf '%s' '{spec}' | sudo -n {helper} unit-install edgekit-evil.service")
    assert leak.rc == REFUSED and "is not under the base" in leak.stderr
    assert b.run(f"touch {b.root}/etc/systemd/system/edgekit-evil.service").rc != 0
    # A unit that did not come from the helper for this user (an earlier edgekit's, run as root, whose program is
    # the user's file) is neither started nor touched for the user.
    (b.root / "etc/systemd/system/edgekit-old.service").write_text(f"[Service]\nExecStart={b.base}/x\n")
    for verb in ("start", "stop"):
        acted = b.run(f"sudo -n {helper} systemctl {verb} edgekit-old.service")
        assert acted.rc == REFUSED and "was not installed by edgekit-root" in acted.stderr
    assert not (b.root / "etc/systemd/system/edgekit-evil.service").exists()

    # Deploy: the server runs as the login user, its log written by it.
    first = ok_json(edgekit("--json", "deploy", "--board", b.name, "--recipe", RECIPE, env=env, timeout=900))
    assert first["health"]["ok"]
    procs = servers_of(b.base)
    assert procs and {p.info["username"] for p in procs} == {USER}
    unit = (b.root / "etc/systemd/system/edgekit-serve.service").read_text()
    assert f"User={USER}" in unit and "append:" not in unit and " exec --log " in unit
    assert "NoNewPrivileges=yes" in unit  # hardening: default
    assert (b.base / "logs/server.log").stat().st_uid == pwd.getpwnam(USER).pw_uid

    # A second release (its watchdog quick to act), then rollback to the first.
    variant = Path(tempfile.mkdtemp(dir=str(b.dir))) / "variant.yaml"
    data = yaml.safe_load((Path(__file__).parents[1] / f"edgekit/data/recipes/{RECIPE}.yaml").read_text())
    data["runtime"].update(draft_n_max=2, watchdog={"every_s": 1, "timeout_s": 1, "failures": 3, "start_grace_s": 5})
    variant.write_text(yaml.safe_dump(data))
    second = ok_json(edgekit("--json", "deploy", "--board", b.name, "--recipe", str(variant), env=env, timeout=900))
    assert second["release"] != first["release"]
    back = ok_json(edgekit("--json", "rollback", "--board", b.name, env=env, timeout=900))
    assert back["release"] == first["release"]
    assert ok_json(edgekit("--json", "status", "--board", b.name, env=env, timeout=900))["current"] == first["release"]

    # Bench: its own unit as the user, the service put back.
    bench = ok_json(edgekit("--json", "bench", "--board", b.name, "--recipe", RECIPE, "--quick", "--n-gen",
                            "32", "--no-llama-bench", "--out", str(b.dir / "bench-out"), env=env, timeout=900))
    assert bench["summary"] and servers_of(b.base)

    # The fleet's rollout (Ansible) of the second release.
    rolled = ok_json(edgekit("--json", "fleet", "rollout", "--recipe", str(variant), "--group", b.name, env=env,
                             timeout=900))
    assert b.name in rolled["succeeded"] and not rolled["failed"]
    assert {p.info["username"] for p in servers_of(b.base)} == {USER}

    # The watchdog (a unit of the user's too) restarts a wedged server through the helper.
    (old,) = servers_of(b.base)
    os.kill(old.pid, signal.SIGSTOP)
    try:
        deadline, new = time.monotonic() + 120, []
        while not new and time.monotonic() < deadline:
            time.sleep(0.5)
            new = [p for p in servers_of(b.base) if p.pid != old.pid]
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(old.pid, signal.SIGCONT)
    assert new and {p.info["username"] for p in new} == {USER}

    # A release that asks for a key, and the key rotated: the server restarts through the helper on the new one.
    keyed = variant.with_name("keyed.yaml")
    data["runtime"].update(auth="key")
    keyed.write_text(yaml.safe_dump(data))
    assert ok_json(edgekit("--json", "deploy", "--board", b.name, "--recipe", str(keyed), env=env,
                           timeout=900))["health"]["ok"]
    rotated = ok_json(edgekit("--json", "board", "key", "rotate", "--board", b.name, env=env, timeout=900))
    assert rotated["release"] and ok_json(edgekit("--json", "status", "--board", b.name, env=env,
                                                  timeout=900))["health"]["ok"]
    assert "--key-file" in (b.root / "etc/systemd/system/edgekit-serve.service").read_text()
