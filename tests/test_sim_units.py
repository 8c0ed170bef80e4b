"""Simulator pieces without sshd: board root layout, known_hosts edits, traces, process ownership,
the sshd config, and the systemctl stand-in run locally."""

from __future__ import annotations

import contextlib
import importlib.machinery
import importlib.util
import json
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import time
from importlib import resources
from pathlib import Path
from types import ModuleType

import pytest
from paramiko.hostkeys import HostKeys

from edgekit.config.profiles import PROFILES, get_profile
from edgekit.errors import EdgekitError
from edgekit.sim import keys, power, procs, rootfs, sshd
from edgekit.sim.state import BoardState

SYSTEMCTL = Path(str(resources.files("edgekit.sim") / "bin" / "systemctl"))


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_board_root_has_a_jetsons_files(tmp_path, name):
    profile = get_profile(name)
    rootfs.make_root(tmp_path / "root", profile, volatile=tmp_path / "shm")
    root = tmp_path / "root"
    assert (root / "sys").is_symlink()  # sensors live on the volatile (tmpfs) side
    assert (root / "etc/nv_tegra_release").read_text().startswith(profile.l4t_release)
    assert (root / "proc/device-tree/model").read_bytes() == profile.model.encode() + b"\0"
    cuda = json.loads((root / "usr/local/cuda/version.json").read_text())["cuda"]
    assert cuda["name"] == "CUDA SDK" and cuda["version"].startswith(profile.cuda_version + ".")
    assert (root / "var/lib/nvpmodel/status").read_text().startswith("pmode:0000")
    watts = rootfs.read_power(root)
    assert watts == pytest.approx({r.label: r.idle_watts for r in profile.power_rails}, rel=0.01)
    for files in rootfs.rail_files(root, profile):
        hwmon = files.hwmon
        assert (hwmon.parent.parent / "name").read_text().strip() == files.rail.chip
        assert (hwmon / f"in{files.rail.channel}_label").read_text().strip() == files.rail.label
        assert len(os.listdir(hwmon.parent)) == 1  # jtop takes the first entry of hwmon/
        if files.rail.chip == "ina238":
            uw = int((hwmon / "power1_input").read_text())
            assert uw == int(files.volt.read_text()) * int(files.curr.read_text())
        else:
            assert (hwmon / f"curr{files.rail.channel}_crit_alarm").read_text() == "0\n"
    zones = sorted((root / "sys/class/thermal").iterdir())
    assert (zones[0] / "type").read_text() == "cpu-thermal\n"
    assert 30_000 < int((zones[0] / "temp").read_text()) < 50_000


def test_known_hosts_pins_replace_stale_lines_and_keep_others(tmp_path):
    kh = tmp_path / "known_hosts"
    salt_line = HostKeys.hash_host("[127.0.0.1]:2201")
    kh.write_text(
        "# mine\n"
        "[127.0.0.1]:2201 ssh-ed25519 OLD1\n"
        f"{salt_line} ssh-ed25519 OLDHASHED\n"
        "[127.0.0.1]:2202,other ssh-rsa OLD2\n"
        "@cert-authority [127.0.0.1]:2201 ssh-ed25519 CA\n"
        "example.org ssh-ed25519 KEEP\n"
    )
    keys.update_known_hosts(kh, pin={"[127.0.0.1]:2201": "ssh-ed25519 NEW1", "[127.0.0.1]:2202": "ssh-ed25519 NEW2"})
    assert kh.read_text().splitlines() == [
        "# mine",
        "@cert-authority [127.0.0.1]:2201 ssh-ed25519 CA",
        "example.org ssh-ed25519 KEEP",
        "[127.0.0.1]:2201 ssh-ed25519 NEW1",
        "[127.0.0.1]:2202 ssh-ed25519 NEW2",
    ]
    keys.update_known_hosts(kh, unpin=["[127.0.0.1]:2202"])
    assert "NEW2" not in kh.read_text() and "NEW1" in kh.read_text()


def test_generated_keys_load_in_paramiko(tmp_path):
    import paramiko

    pub = keys.generate_ed25519(tmp_path / "k", "c")
    key = paramiko.Ed25519Key.from_private_key_file(str(tmp_path / "k"))
    assert f"{key.get_name()} {key.get_base64()}" == pub == keys.public_key(tmp_path / "k")
    assert (tmp_path / "k").stat().st_mode & 0o077 == 0


def test_power_trace_interpolates_and_holds_its_ends(tmp_path):
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"start": 1000.0, "points": [[2, 30.0], [0, 10.0]]}))
    trace = power.Trace.load(path)
    assert [trace.at(t) for t in (990.0, 1000.0, 1001.0, 1002.0, 1050.0)] == [10.0, 10.0, 20.0, 30.0, 30.0]
    path.write_text("[[0, 5], [1, 7]]")  # a bare list starts at the file's mtime
    assert power.Trace.load(path).start == pytest.approx(path.stat().st_mtime)


def test_processes_belong_to_the_board_they_were_started_on():
    token = "t0k3n"
    table = power.ProcTable(token)
    table.scan({})
    env = {**os.environ, "EDGEKIT_SIM_ID": token, "EDGEKIT_SIM_BOARD": "b2"}
    procs = [
        subprocess.Popen(["sh", "-c", "sleep 3 & wait"]),  # a tree under board b1's "sshd"
        subprocess.Popen(["sh", "-c", "(sleep 3 &)"], env=env),  # orphaned at once: found by its variables
        subprocess.Popen(["sleep", "3"]),  # nobody's
    ]
    b1: set[int] = set()
    b2: set[int] = set()
    try:
        time.sleep(0.2)
        table.scan({procs[0].pid: "b1"})
        members = table.members()
        b1, b2 = set(members.get("b1", {})), set(members.get("b2", {}))
        assert procs[0].pid in b1 and len(b1) == 2  # sh and its sleep
        assert len(b2) == 1
        assert procs[2].pid not in b1 | b2
    finally:
        for pid in b1 | b2:  # the sleeps we started, by pid
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for p in procs:
            p.kill()
            p.wait()


def _board(tmp_path: Path) -> BoardState:
    d = tmp_path / "my board"  # a space: paths get quoted
    (d / "ssh").mkdir(parents=True)
    b = BoardState(name="sim-1", profile="orin", dir=str(d), port=2299, service_port=2300,
                   user=os.environ.get("USER", "root") if os.geteuid() else "root", host_key_pub="")
    b.host_key_pub = keys.generate_ed25519(b.host_key, "h")
    return b


def test_sshd_config_has_what_a_sim_board_needs(tmp_path):
    b = _board(tmp_path)
    text = sshd.config_text(b, tmp_path / "authorized_keys", {"EDGEKIT_BOARD_ROOT": str(b.root), "PATH": "/x:/usr/bin"})
    for line in ("ListenAddress 127.0.0.1:2299", "UsePAM no", "StrictModes no", "Subsystem sftp internal-sftp",
                 "MaxStartups 100:30:200", "PasswordAuthentication no", "KbdInteractiveAuthentication no",
                 "PermitRootLogin prohibit-password", f'HostKey "{b.host_key}"',
                 f'SetEnv "EDGEKIT_BOARD_ROOT={b.root}" PATH=/x:/usr/bin'):
        assert line in text.splitlines(), line
    with pytest.raises(EdgekitError):
        sshd.config_text(b, Path('/tmp/a"b'), {})
    if shutil.which("sshd", path="/usr/sbin:/usr/local/sbin:" + os.environ.get("PATH", "")):
        sshd.prepare_privsep()
        b.sshd_config.write_text(text)
        sshd.check_config(sshd.find_sshd(), b)  # sshd -t accepts it


def _load_systemctl() -> ModuleType:
    loader = importlib.machinery.SourceFileLoader("sim_systemctl", str(SYSTEMCTL))
    spec = importlib.util.spec_from_loader("sim_systemctl", loader)
    assert spec is not None
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


def test_systemctl_parses_units_like_systemd(tmp_path):
    sc = _load_systemctl()
    sc.UNIT_DIR = str(tmp_path)
    (tmp_path / "x.service").write_text(
        "[Unit]\nDescription=X\n[Service]\n"
        'Environment="A=1 2" B=3\nEnvironment=ARGS="--a --b"\n'
        "ExecStart=-/usr/bin/prog ${A} $ARGS \\\n   --port=${B} %n 100%%\n")
    sections = sc.parse_unit("x.service")
    env = sc.service_env("x.service", sections)
    assert (env["A"], env["B"], env["ARGS"]) == ("1 2", "3", "--a --b")
    argv, ignore = sc.command(sc.get(sections, "Service", "ExecStart"), "x.service", env)
    assert argv == ["/usr/bin/prog", "1 2", "--a", "--b", "--port=3", "x.service", "100%"] and ignore
    assert sc.unit_name("x") == "x.service"
    for bad in ("../x", "..", "a/b", ".hidden"):
        with pytest.raises(sc.Fail):
            sc.unit_name(bad)


def _sc(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "EDGEKIT_BOARD_ROOT": str(root)}
    return subprocess.run([sys.executable, str(SYSTEMCTL), *args], env=env, capture_output=True, text=True,
                          timeout=30, check=False)


def test_systemctl_lifecycle_and_exit_codes(tmp_path):
    units = tmp_path / "etc/systemd/system"
    units.mkdir(parents=True)
    (units / "s.service").write_text("[Service]\nExecStart=/bin/sleep 30\n")
    (units / "flaky.service").write_text(
        f"[Service]\nExecStart=/bin/sh -c 'echo run >> {tmp_path}/runs; exit 1'\nRestart=on-failure\nRestartSec=0.1\n")
    try:
        assert _sc(tmp_path, "is-enabled", "s").returncode == 1
        assert _sc(tmp_path, "enable", "s").returncode == 0
        assert _sc(tmp_path, "is-enabled", "s").stdout == "enabled\n"
        assert _sc(tmp_path, "start", "s").returncode == 0
        assert _sc(tmp_path, "is-active", "s").returncode == 0
        main = int(_sc(tmp_path, "show", "s", "-p", "MainPID", "--value").stdout)
        assert main > 0
        assert _sc(tmp_path, "restart", "s").returncode == 0
        assert int(_sc(tmp_path, "show", "s", "-p", "MainPID", "--value").stdout) != main
        assert _sc(tmp_path, "stop", "s").returncode == 0
        assert (_sc(tmp_path, "is-active", "s").returncode, _sc(tmp_path, "status", "s").returncode) == (3, 3)
        assert _sc(tmp_path, "start", "flaky").returncode == 0
        time.sleep(0.6)
        assert len((tmp_path / "runs").read_text().splitlines()) >= 2  # Restart=on-failure
        assert _sc(tmp_path, "stop", "flaky").returncode == 0
        assert _sc(tmp_path, "is-active", "flaky").stdout == "inactive\n"
        assert "Scheduled restart job" in _sc(tmp_path, "status", "flaky", "-n", "50").stdout
    finally:
        _sc(tmp_path, "stop", "s")
        _sc(tmp_path, "stop", "flaky")


@pytest.mark.skipif(not shutil.which("sshd", path="/usr/sbin:/usr/local/sbin:" + os.environ.get("PATH", "")),
                    reason="needs OpenSSH's sshd")
def test_sshd_moves_to_another_port_when_its_port_is_taken(tmp_path):
    import socket

    from edgekit.sim import procs

    b = _board(tmp_path)
    sshd.prepare_privsep()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        b.port = taken.getsockname()[1]
        (tmp_path / "authorized_keys").write_text("")
        sshd.write_config(b, tmp_path / "authorized_keys", {"EDGEKIT_BOARD_ROOT": str(b.root)})
        try:
            sshd.start(sshd.find_sshd(), b)
            assert b.port != taken.getsockname()[1] and procs.alive(b.sshd_pid)
            assert f"ListenAddress 127.0.0.1:{b.port}" in b.sshd_config.read_text()
        finally:
            if b.sshd_pid:
                assert procs.stop(procs.tree(b.sshd_pid)) == []


def test_emulated_arch_is_aarch64_or_this_machines_own():
    from edgekit.sim import emulation

    assert emulation.board_arch(None) is None
    assert emulation.board_arch(platform.machine()) is None  # this machine's own: no emulation
    assert emulation.board_arch("aarch64") == "aarch64"
    with pytest.raises(EdgekitError, match="not 'riscv64'"):
        emulation.board_arch("riscv64")


def test_the_emulator_gives_aarch64_binaries_to_qemu_in_its_namespace_only(tmp_path):
    # A static aarch64 program is not at hand; the cross sysroot's loader is an aarch64 ELF that
    # prints its usage when run: under the emulator it runs, on the host it cannot.
    from edgekit.sim import emulation

    qemu = emulation.check_available()
    loader = str(emulation.SYSROOT / "lib" / "ld-linux-aarch64.so.1")
    env = {**os.environ, **emulation.board_env(tmp_path)}
    inside = subprocess.run([sys.executable, str(emulation.LAUNCHER), "--qemu", qemu, "--", loader, "--help"],
                            capture_output=True, text=True, env=env, timeout=60, check=False)
    assert inside.returncode == 0 and "--list" in inside.stdout, inside.stderr
    with pytest.raises(OSError):  # the host's exec table was not touched
        subprocess.run([loader, "--help"], capture_output=True, timeout=60, check=False)


def test_port_kinds_never_share_a_port_and_a_service_port_brings_a_free_candidate():
    # A service port's candidate (+1) is unbound between switches: an sshd port drawn then must
    # never land on it, in this sim dir or another one that knows nothing of it.
    ports = {kind: {procs.free_port(kind=kind) for _ in range(40)} for kind in procs.PORT_RESIDUE}
    candidates = {p + 1 for p in ports["service"]}
    assert not candidates & (ports["ssh"] | ports["other"] | ports["service"])
    assert not ports["ssh"] & ports["other"]
    with socket.socket() as held:
        service = procs.free_port(kind="service")
        held.bind(("127.0.0.1", service + 1))
        for _ in range(30):
            assert procs.free_port(kind="service") != service  # its candidate is taken
