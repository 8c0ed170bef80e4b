"""Simulated boards end to end: real sshd, real SSH (paramiko, pinned keys, RejectPolicy), real load."""

from __future__ import annotations

import itertools
import json
import os
import statistics
import time
import urllib.request
from pathlib import Path

import paramiko
import psutil
import pytest
import yaml
from click.testing import CliRunner

from edgekit.cli import cli
from edgekit.config.boardfile import Boards
from edgekit.config.profiles import get_profile
from edgekit.sim import boards as sim
from edgekit.sim import keys, rootfs
from edgekit.sim.testing import SimBoard

pytestmark = pytest.mark.skipif(not any(os.path.exists(f"{d}/sshd") for d in ("/usr/sbin", "/usr/local/sbin")),
                                reason="needs OpenSSH's sshd (apt-get install openssh-server)")

BURN = "for i in 1 2; do timeout {s} python3 -c 'while True: pass' & done; wait"


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE  # where PID 1 does not reap
    except psutil.NoSuchProcess:
        return True


def _sample(boards: list[SimBoard], seconds: float) -> list[list[float]]:
    """Total-rail watts of each board, read every 50 ms for ``seconds``."""
    out: list[list[float]] = [[] for _ in boards]
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for i, b in enumerate(boards):
            out[i].append(b.total_watts())
        time.sleep(0.05)
    return out


def test_boards_look_like_jetsons_and_are_published(sim_boards):
    a, b = sim_boards(2)
    profile = get_profile("orin")
    for board in (a, b):
        with board.connect() as client:
            def sh(cmd: str, client: paramiko.SSHClient = client) -> str:
                _, out, err = client.exec_command(cmd)
                assert out.channel.recv_exit_status() == 0, err.read().decode()
                return out.read().decode()

            assert sh('head -n 1 "$EDGEKIT_BOARD_ROOT/etc/nv_tegra_release"').startswith(
                "# R36 (release), REVISION: 4.3")
            model = sh('cat "$EDGEKIT_BOARD_ROOT/proc/device-tree/model"')
            assert model == profile.model + "\0"  # NUL-terminated, as on a real board
            assert sh('cat "$EDGEKIT_BOARD_ROOT/sys/firmware/devicetree/base/model"') == model
            cuda = json.loads(sh('cat "$EDGEKIT_BOARD_ROOT/usr/local/cuda/version.json"'))
            assert cuda["cuda"]["name"] == "CUDA SDK" and cuda["cuda"]["version"].startswith("12.6.")
            assert sh("echo $EDGEKIT_SIM_BOARD").strip() == board.name
            assert sh("command -v systemctl").strip() == str(board.dir / "bin" / "systemctl")
            assert sh("nvpmodel -q").startswith("NV Power Mode: MAXN")
            hwmon = sh('cat "$EDGEKIT_BOARD_ROOT"/sys/bus/i2c/devices/1-0040/name '
                       '"$EDGEKIT_BOARD_ROOT"/sys/bus/i2c/devices/1-0040/hwmon/hwmon*/in*_label').split()
            assert hwmon == ["ina3221", *(r.label for r in profile.power_rails)]
    entries = Boards(Path(os.environ["EDGEKIT_CONFIG"])).load().boards
    known = (Path(os.environ["EDGEKIT_CONFIG_DIR"]) / "known_hosts").read_text().splitlines()
    for board in (a, b):
        e = entries[board.name]
        assert (e.sim, e.host, e.port, e.base) == (True, "127.0.0.1", board.port, str(board.base))
        assert e.key == str(board.key) and e.service_port == board.service_port
        assert e.profile == "orin-agx-64gb" and e.user == board.user
        assert sum(line.startswith(f"[127.0.0.1]:{board.port} ssh-ed25519 ") for line in known) == 1
    assert len({a.port, b.port, a.service_port, b.service_port}) == 4


def test_host_keys_are_pinned_and_checked(sim_boards):
    a, b = sim_boards(2)
    a.run("true")  # pinned key + RejectPolicy: accepted
    for host_keys in ("", f"[127.0.0.1]:{a.port} " + (b.dir / "ssh/ssh_host_ed25519_key.pub").read_text()):
        kh = a.dir.parent / "other_known_hosts"
        kh.write_text(host_keys)
        client = paramiko.SSHClient()
        client.load_host_keys(str(kh))
        client.set_missing_host_key_policy(paramiko.RejectPolicy())
        with pytest.raises(paramiko.SSHException):  # unknown → refused; another board's key → BadHostKey
            client.connect("127.0.0.1", port=a.port, username=a.user, key_filename=str(a.key),
                           look_for_keys=False, allow_agent=False, timeout=10)
        client.close()


def test_boards_do_not_share_files(sim_boards):
    a, b = sim_boards(2)
    with a.connect() as client, client.open_sftp() as sftp:
        with sftp.open(f"{a.base}/only-on-a.txt", "w") as fh:
            fh.write("a")
        sftp.stat(f"{a.base}/only-on-a.txt")
    try:
        res = b.run('ls -A "$(dirname "$EDGEKIT_BOARD_ROOT")/base"; echo "root=$EDGEKIT_BOARD_ROOT"')
        assert "only-on-a.txt" not in res.stdout
        assert f"root={b.root}" in res.stdout and a.root != b.root and a.base != b.base
    finally:
        (a.base / "only-on-a.txt").unlink()  # the boards are shared with other tests


def test_power_follows_each_boards_own_load(sim_boards):
    a, b = sim_boards(2)
    idle_a, idle_b = (statistics.median(s) for s in _sample([a, b], 0.5))
    with a.connect() as client:
        _, out, _ = client.exec_command(BURN.format(s=1.6))
        time.sleep(0.5)  # the updater finds new processes within 0.25 s and averages over 0.3 s
        busy_a, busy_b = (statistics.mean(s) for s in _sample([a, b], 0.9))
        out.channel.recv_exit_status()
    per_core = next(r.watts_per_busy_core for r in get_profile(a.profile).power_rails
                    if r.label == get_profile(a.profile).total_power_rail)
    assert busy_a > idle_a + 0.25 * per_core, (idle_a, busy_a)  # ≥ a quarter core, even on a loaded host
    assert abs(busy_b - idle_b) < 0.1, (idle_b, busy_b)  # b's own processes idled


def test_sensors_update_at_least_10_hz_and_follow_a_trace(sim_boards):
    _, b = sim_boards(2)
    profile = get_profile(b.profile)
    total = next(f for f in rootfs.rail_files(b.root, profile) if f.rail.label == profile.total_power_rail)
    trace = b.dir / "power_trace.json"
    start = time.time()
    trace.write_text(json.dumps({"start": start, "points": [[0, 10.0], [3.0, 40.0]]}))
    try:
        time.sleep(0.3)
        values, mtimes = [], set()
        end = time.monotonic() + 1.0
        while time.monotonic() < end:
            values.append(int(total.curr.read_text()))  # never half a number: files are replaced whole
            mtimes.add(total.curr.stat().st_mtime_ns)
            time.sleep(0.01)
        changes = sum(1 for x, y in itertools.pairwise(values) if x != y)
        assert changes >= 10 and len(mtimes) >= 10, (changes, len(mtimes))
        expected = 10.0 + 10.0 * (time.time() - start)  # 10 W/s ramp
        assert abs(b.total_watts() - expected) < 1.5
    finally:
        trace.unlink()
    time.sleep(0.3)
    assert b.total_watts() < 10.0  # back to the load-driven value


def test_systemctl_stand_in_runs_units(sim_boards):
    (a,) = sim_boards(1, fresh=True)  # its service port must be free: no deploy test's server there
    units = a.root / "etc/systemd/system"
    (units / "edgekit-web.service").write_text(
        "[Unit]\nDescription=test web server\n[Service]\n"
        f'Environment="PORT={a.service_port}" "GREETING=hello world"\nWorkingDirectory={a.base}\n'
        "ExecStart=/usr/bin/env python3 -m http.server ${PORT} \\\n  --bind 127.0.0.1\n"
        "[Install]\nWantedBy=multi-user.target\n")
    (units / "edgekit-fails.service").write_text("[Service]\nExecStart=/bin/sh -c 'exit 3'\n")
    (units / "edgekit-noexec.service").write_text("[Service]\nExecStart=/nonexistent/server\n")
    try:
        _exercise_systemctl(a)
    finally:
        a.run("systemctl stop edgekit-web edgekit-fails; systemctl reset-failed")
        for name in ("edgekit-web", "edgekit-fails", "edgekit-noexec"):
            (units / f"{name}.service").unlink()


def _exercise_systemctl(a: SimBoard) -> None:
    with a.connect() as client:
        def sh(cmd: str) -> tuple[int, str]:
            _, out, _ = client.exec_command(cmd)
            rc = out.channel.recv_exit_status()
            return rc, out.read().decode().strip()

        assert sh("systemctl daemon-reload") == (0, "")
        assert sh("systemctl is-active edgekit-web") == (3, "inactive")
        assert sh("systemctl enable --now edgekit-web")[0] == 0
        assert sh("systemctl is-active edgekit-web.service") == (0, "active")
        assert sh("systemctl is-enabled edgekit-web") == (0, "enabled")
        deadline = time.monotonic() + 10
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{a.service_port}/", timeout=2) as resp:
                    assert resp.status == 200
                break
            except OSError:
                assert time.monotonic() < deadline, "the unit's web server never answered"
                time.sleep(0.1)
        rc, status = sh("systemctl status edgekit-web")
        assert rc == 0 and "Active: active (running)" in status
        main = int(sh("systemctl show edgekit-web -p MainPID --value")[1])
        assert "http.server" in " ".join(psutil.Process(main).cmdline())
        assert "Started test web server." in sh("journalctl -u edgekit-web -n 20")[1]
        assert sh("systemctl stop edgekit-web")[0] == 0
        assert sh("systemctl is-active edgekit-web") == (3, "inactive")
        assert _gone(main)
        assert sh("systemctl disable edgekit-web; systemctl is-enabled edgekit-web") == (1, "disabled")
        assert sh("systemctl start edgekit-fails")[0] == 0  # Type=simple: the start itself succeeds
        time.sleep(0.3)
        assert sh("systemctl is-active edgekit-fails") == (3, "failed")
        assert sh("systemctl start edgekit-noexec")[0] == 1  # the program cannot be executed
        assert sh("systemctl start edgekit-missing")[0] == 5
        assert sh("systemctl status edgekit-missing")[0] == 4


def test_a_services_cpu_load_counts_for_its_board(sim_boards):
    a, _ = sim_boards(2)
    (a.base / "burn.sh").write_text(BURN.format(s=1.6) + "\n")
    (a.root / "etc/systemd/system/edgekit-burn.service").write_text(
        f"[Service]\nExecStart=/bin/sh {a.base}/burn.sh\n")
    try:
        idle_a = statistics.median(_sample([a], 0.4)[0])
        assert a.run("systemctl start edgekit-burn").rc == 0  # the unit runs detached from the session
        time.sleep(0.5)
        busy_a = statistics.mean(_sample([a], 0.8)[0])
    finally:
        a.run("systemctl stop edgekit-burn")
        (a.root / "etc/systemd/system/edgekit-burn.service").unlink()
        (a.base / "burn.sh").unlink()
    assert busy_a > idle_a + 0.15, (idle_a, busy_a)


def test_down_leaves_nothing_behind(tmp_path):
    targets = sim.Targets(tmp_path / "edgekit.yaml", tmp_path / "known_hosts")
    targets.board_file.write_text(yaml.safe_dump({"boards": {"jetson": {
        "host": "10.0.0.5", "user": "nvidia", "profile": "orin-nx-16gb"}}}))
    other = "10.0.0.5 " + keys.generate_ed25519(tmp_path / "other_key", "other")
    targets.known_hosts.write_text(other + "\n")
    st, created, restarted = sim.up(tmp_path / "sim", 1, "thor", targets)
    try:
        assert (created, restarted) == (["sim-1"], [])
        board = SimBoard.from_state(st, st.boards["sim-1"], targets.known_hosts)
        assert 17.0 < board.power()["VIN"] < 19.5  # Thor: one INA238 on the 19 V input
        assert (board.root / "sys/bus/i2c/devices/2-0044/name").read_text() == "ina238\n"
        (board.root / "etc/systemd/system/sleeper.service").write_text("[Service]\nExecStart=/bin/sleep 301\n")
        res = board.run("systemctl start sleeper && (setsid nohup sleep 302 >/dev/null 2>&1 </dev/null &) && "
                        "(sleep 303 >/dev/null 2>&1 </dev/null &) && echo ok")
        assert res.stdout.strip() == "ok", res
        time.sleep(0.2)
        pids = {p.pid for p in sim.board_processes(st.boards["sim-1"])} | {st.updater_pid, board.sshd_pid}
        sleepers = {p.pid for p in psutil.process_iter(["cmdline"])
                    if len(p.info["cmdline"] or []) == 2 and p.info["cmdline"][0].endswith("sleep")
                    and p.info["cmdline"][1] in ("301", "302", "303")}
        assert len(sleepers) == 3
    finally:
        sim.down(tmp_path / "sim")
    assert all(_gone(pid) for pid in pids | sleepers if pid)
    assert list(Boards(targets.board_file).load().boards) == ["jetson"]
    assert targets.known_hosts.read_text().splitlines() == [other]
    assert not (tmp_path / "sim/state.json").exists()
    assert st.volatile_dir is None or not Path(st.volatile_dir).exists()


def test_a_clock_step_does_not_make_running_boards_look_dead(tmp_path, monkeypatch):
    # A board is "still running" by its sshd's pid and start time. The epoch start time moves with the
    # clock (boot time + start): after a step the boards were started a second time beside the first.
    from edgekit.sim import procs

    targets = sim.Targets(tmp_path / "edgekit.yaml", tmp_path / "known_hosts")
    st, created, _ = sim.up(tmp_path / "sim", 1, "orin", targets)
    try:
        board = st.boards[created[0]]
        stepped = psutil.boot_time() + 3.0  # what psutil computes after the clock jumped 3 s
        monkeypatch.setattr("psutil._pslinux.boot_time", lambda: stepped)  # psutil's epoch start times use it
        assert procs.alive(board.sshd_pid, board.sshd_ctime)
        st2, created2, restarted = sim.up(tmp_path / "sim", 1, "orin", targets)
        assert (created2, restarted) == ([], []) and st2.boards["sim-1"].sshd_pid == board.sshd_pid
        # A board whose sshd really died is started again: in use before, so it is not a new one.
        assert procs.stop(procs.tree(board.sshd_pid)) == []
        st3, created3, restarted3 = sim.up(tmp_path / "sim", 1, "orin", targets, add=True)
        assert (created3, restarted3) == (["sim-2"], ["sim-1"])
        assert procs.alive(st3.boards["sim-1"].sshd_pid, st3.boards["sim-1"].sshd_ctime)
    finally:
        sim.down(tmp_path / "sim")


def test_cli_up_is_idempotent_and_down_cleans_up(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGEKIT_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.setenv("EDGEKIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("EDGEKIT_CONFIG", str(tmp_path / "config/edgekit.yaml"))
    runner = CliRunner()
    simdir = str(tmp_path / "sims")
    try:
        first = runner.invoke(cli, ["sim", "up", "--dir", simdir, "--profile", "orin-nx-16gb", "--json"])
        assert first.exit_code == 0, first.output
        data = json.loads(first.stdout)
        assert data["started"] == ["sim-1"] and data["boards"][0]["rails"]["VDD_IN"] > 4.0
        again = runner.invoke(cli, ["sim", "up", "--dir", simdir, "--profile", "orin-nx-16gb", "--json"])
        assert json.loads(again.stdout)["started"] == []
        status = json.loads(runner.invoke(cli, ["sim", "status", "--dir", simdir, "--json"]).stdout)
        assert status["updater"]["alive"] and status["boards"][0]["alive"]
        pids = [status["updater"]["pid"], status["boards"][0]["sshd_pid"]]
        down = runner.invoke(cli, ["sim", "down", "--dir", simdir])
        assert down.exit_code == 0 and "Stopped sim-1" in down.output
    finally:
        sim.down(Path(simdir))  # no-op when the CLI already did it
    assert all(_gone(p) for p in pids)
    assert json.loads(runner.invoke(cli, ["sim", "status", "--dir", simdir, "--json"]).stdout)["boards"] == []
    assert Boards(tmp_path / "config/edgekit.yaml").load().boards == {}


def test_down_without_dir_finds_the_boards_the_board_file_names(tmp_path, monkeypatch):
    # `sim up --dir D` then plain `sim down`: the board file says where D is; D's processes must stop.
    monkeypatch.setenv("EDGEKIT_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.setenv("EDGEKIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("EDGEKIT_CONFIG", str(tmp_path / "config/edgekit.yaml"))
    runner = CliRunner()
    simdir = tmp_path / "elsewhere"
    try:
        up = runner.invoke(cli, ["sim", "up", "--dir", str(simdir), "--json"])
        assert up.exit_code == 0, up.output
        status = json.loads(runner.invoke(cli, ["sim", "status", "--dir", str(simdir), "--json"]).stdout)
        pids = [status["updater"]["pid"], status["boards"][0]["sshd_pid"]]
        down = runner.invoke(cli, ["sim", "down", "--json"])
        assert down.exit_code == 0, down.output
        data = json.loads(down.stdout)
        assert data["stopped"] == ["sim-1"] and str(simdir.resolve()) in [r["dir"] for r in data["dirs"]]
    finally:
        sim.down(simdir)
    assert all(_gone(p) for p in pids)
    assert Boards(tmp_path / "config/edgekit.yaml").load().boards == {}
    empty = runner.invoke(cli, ["sim", "down"])
    assert empty.exit_code == 0 and "Stopped no boards" in empty.output
