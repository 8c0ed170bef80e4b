"""`edgekit fleet` against simulated boards: real ansible-playbook, real sshd, real llama-server."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml
from build_helpers import sdist_or_skip
from cli_helpers import EDGEKIT, edgekit

from edgekit.config.boardfile import Boards
from edgekit.sim import faults
from edgekit.sim.testing import SimBoard
from edgekit.store import sha256_file

REPO = Path(__file__).resolve().parents[1]
GROUP, CANARY = "fleettest", "fleettest-canary"

pytestmark = pytest.mark.skipif(not Path(sys.executable).with_name("ansible-playbook").is_file(),
                                reason="ansible-core is not installed (pip install 'ansible-core==2.19.*')")


def rollout(env: dict[str, str], *args: str, ok: bool = True) -> dict[str, Any]:
    res = edgekit("--json", "fleet", "rollout", *args, env=env, timeout=900)
    # the failed boards' reasons are in the JSON report on stdout
    assert (res.returncode == 0) == ok, res.stderr[-3000:] + res.stdout[-3000:]
    assert "Traceback" not in res.stderr, res.stderr[-3000:]
    return json.loads(res.stdout)


def complete(port: int, n: int = 8) -> dict[str, Any]:
    body = json.dumps({"prompt": "Hello", "n_predict": n, "temperature": 0}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/completion", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        return json.loads(resp.read())


def variant(tmp: Path, **runtime: object) -> str:
    data = yaml.safe_load((REPO / "edgekit" / "data" / "recipes" / "sim-tiny-mtp.yaml").read_text())
    data["runtime"].update(runtime)
    path = tmp / f"sim-tiny-mtp-{hashlib.sha256(repr(sorted(runtime.items())).encode()).hexdigest()[:8]}.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def snapshot(board: SimBoard) -> dict[str, Any]:
    """Everything a release leaves on the board: the tree under base (not logs), the installed units."""
    out: dict[str, Any] = {}
    roots = {"base": board.base, "units": board.root / "etc" / "systemd" / "system"}
    for label, root in roots.items():
        if not root.exists():
            continue
        for path in sorted(root.rglob("*")):
            rel = f"{label}/{path.relative_to(root)}"
            if rel.startswith("base/logs/"):
                continue
            st = path.lstat()
            if path.is_symlink():
                out[rel] = ("link", os.readlink(path))
            elif path.is_dir():
                out[rel] = ("dir", oct(st.st_mode & 0o7777))
            elif path.name == "health.json":  # a measurement (tok/s, drafts): what it records, not its values
                record = json.loads(path.read_text())
                out[rel] = ("health", oct(st.st_mode & 0o7777), record["ok"], record["draft_n"] > 0)
            else:
                out[rel] = ("file", oct(st.st_mode & 0o7777), st.st_nlink,
                            hashlib.sha256(path.read_bytes()).hexdigest())
    return out


class PortBlocker:
    """Another process on a board's port: an HTTP server that answers 404 to everything."""

    def __init__(self, port: int) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_error(404)

            do_POST = do_GET

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> PortBlocker:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def fleet(sim_session) -> Iterator[tuple[list[SimBoard], dict[str, str]]]:
    """Four fresh boards in group `fleettest`, the first of them the canary; env for `edgekit`."""
    boards = sim_session.boards(4, fresh=True)
    env = {**os.environ, **sim_session.env, "EDGEKIT_LLAMA_SRC": str(sdist_or_skip())}
    file = Boards(Path(sim_session.env["EDGEKIT_CONFIG"]))
    data = file.load()
    data.groups[GROUP] = [b.name for b in boards]
    data.groups[CANARY] = [boards[0].name]
    file.save(data)
    yield boards, env
    data = file.load()
    data.groups.pop(GROUP, None)
    data.groups.pop(CANARY, None)
    file.save(data)


def _group(*names: str) -> list[str]:
    return ["--group", GROUP, "--canary", CANARY, *names]


def test_canary_then_batches_all_healthy_then_nothing_to_do(fleet) -> None:
    boards, env = fleet
    before = {b.name: b.logins() for b in boards}
    first = rollout(env, "--recipe", "sim-tiny-mtp", *_group(), "--batch", "1,25%,100%")
    # One SSH connection per board for the whole run: edgekit's probe, lock and state, then every play.
    assert {b.name: b.logins() - before[b.name] for b in boards} == {b.name: 1 for b in boards}
    names = [b.name for b in boards]
    assert sorted(first["succeeded"]) == sorted(names) and not first["failed"] and not first["untouched"]
    assert sorted(first["changed"]) == sorted(names) and first["canary"] == [names[0]]
    manifests = []
    for b in boards:
        row = first["succeeded"][b.name]
        assert row["release"] == first["planned"][b.name] and row["health"]["ok"]
        assert row["health"]["draft_n"] > 0 and row["push"]["sent_blobs"] > 0  # the MTP drafter drafted
        assert os.readlink(b.base / "current") == f"releases/{row['release']}"
        assert (b.base / "serving").read_text().strip() == row["release"]
        assert complete(b.service_port)["tokens_predicted"] > 0
        manifests.append(json.loads((b.base / "current" / "release.json").read_text()))
    # Same release everywhere: one build, the same models and binaries; only the board's port and base
    # (in the unit files) differ, and with them the id.
    same = {k: v for k, v in manifests[0]["files"].items() if k != "units.json"}
    for m in manifests[1:]:
        assert {k: v for k, v in m["files"].items() if k != "units.json"} == same
        assert m["build"] == manifests[0]["build"] and m["recipe"] == "sim-tiny-mtp"
    # The run's SSH masters and control sockets are gone.
    assert not [p for p in psutil.process_iter(["cmdline"]) if "ek-cp-" in " ".join(p.info["cmdline"] or [])]

    # The activation recorded each board's health beside its release: a re-run that changes nothing is
    # decided from that, /health and the release ids alone, and runs no playbook.
    for b in boards:
        assert json.loads((b.base / "current" / "health.json").read_text())["draft_n"] > 0
    again = rollout(env, "--recipe", "sim-tiny-mtp", *_group())
    assert again["changed"] == [] and sorted(again["succeeded"]) == sorted(names)
    assert again["playbook"].startswith("skipped") and again["ansible_seconds"] == 0
    for row in again["succeeded"].values():
        assert row["push"]["sent_bytes"] == 0 and row["push"]["sent_blobs"] == 0 and row["health"]["ok"]
        assert row["health"]["method"] == "recorded"
    # One board whose server died: the playbook runs again, for it alone, and brings it back; the others
    # are reported as they are, from their recorded checks (as when all of them serve).
    victim = boards[-1]
    assert victim.run("systemctl stop edgekit-serve.service").rc == 0
    healed = rollout(env, "--recipe", "sim-tiny-mtp", *_group())
    assert "playbook" not in healed and sorted(healed["succeeded"]) == sorted(names) and not healed["failed"]
    assert healed["changed"] == [victim.name] and complete(victim.service_port)["tokens_predicted"] > 0
    assert healed["succeeded"][victim.name]["health"]["method"] != "recorded"
    assert {r["health"]["method"] for n, r in healed["succeeded"].items() if n != victim.name} == {"recorded"}
    assert healed["succeeded"][victim.name]["push"]["sent_bytes"] == 0  # its release was still there
    # One board serves its release but has no recorded check: the playbook runs for it alone, checks it in
    # full (serving.yml) and leaves the running server as it is.
    doubted = boards[1]
    main_pid = doubted.run("systemctl show -p MainPID --value edgekit-serve.service").stdout.strip()
    (doubted.base / "current" / "health.json").unlink()
    checked = rollout(env, "--recipe", "sim-tiny-mtp", *_group())
    assert "playbook" not in checked and checked["changed"] == [] and not checked["failed"]
    assert sorted(checked["succeeded"]) == sorted(names)
    row = checked["succeeded"][doubted.name]
    assert row["health"]["ok"] and row["health"]["method"] != "recorded" and not row["would_activate"]
    assert row["push"]["sent_bytes"] == 0 and row["previous"] == row["release"] == first["planned"][doubted.name]
    assert doubted.run("systemctl show -p MainPID --value edgekit-serve.service").stdout.strip() == main_pid != "0"


def test_check_mode_changes_nothing(fleet, tmp_path: Path) -> None:
    boards, env = fleet
    rollout(env, "--recipe", "sim-tiny-mtp", *_group(), "--batch", "100%")
    before = {b.name: snapshot(b) for b in boards}
    report = rollout(env, "--recipe", variant(tmp_path, draft_n_max=2), *_group(), "--batch", "100%", "--check")
    assert report["check"] and report["changed"] == [] and not report["failed"]
    for b in boards:
        row = report["succeeded"][b.name]
        assert row["would_activate"] and row["would_create_release"] and row["push"]["missing_blobs"] > 0
        assert row["push"]["sent_blobs"] == 0
    assert {b.name: snapshot(b) for b in boards} == before


def test_failed_board_is_rolled_back_and_max_fail_is_respected(fleet, tmp_path: Path) -> None:
    boards, env = fleet
    base = rollout(env, "--recipe", "sim-tiny-mtp", *_group(), "--batch", "100%")
    old = {n: r["release"] for n, r in base["succeeded"].items()}
    bad = boards[2]
    recipe = variant(tmp_path, draft_n_max=1)
    # Another process holds the bad board's candidate port: its new release cannot come up there.
    with PortBlocker(bad.service_port + 1):
        stop = rollout(env, "--recipe", recipe, *_group(), "--batch", "1", "--max-fail", "0",
                       "--health-timeout", "20", ok=False)
        assert sorted(stop["succeeded"]) == sorted([boards[0].name, boards[1].name])
        assert list(stop["failed"]) == [bad.name] and stop["untouched"] == [boards[3].name] and stop["stopped"]
        reason = stop["failed"][bad.name]["reason"]
        assert "failed its health check" in reason and f"still serves {old[bad.name]}" in reason, reason
        assert "couldn't bind" in stop["failed"][bad.name]["logs"]
        assert os.readlink(bad.base / "current") == f"releases/{old[bad.name]}"
        assert complete(bad.service_port)["tokens_predicted"] > 0  # still serving its previous release
        assert os.readlink(boards[3].base / "current") == f"releases/{old[boards[3].name]}"  # untouched

        go_on = rollout(env, "--recipe", recipe, *_group(), "--batch", "100%", "--max-fail", "50",
                        "--health-timeout", "20", ok=False)
        assert list(go_on["failed"]) == [bad.name] and go_on["untouched"] == []
        assert boards[3].name in go_on["changed"] and not go_on["stopped"]
    status = json.loads(edgekit("--json", "fleet", "status", "--group", GROUP, env=env, timeout=900).stdout)["boards"]
    assert status[bad.name]["current"] == status[bad.name]["serving"] == old[bad.name]
    assert all(row["health"]["ok"] for row in status.values())
    assert status[boards[3].name]["current"] == go_on["succeeded"][boards[3].name]["release"]


def test_in_place_failure_restores_the_previous_release(fleet, tmp_path: Path) -> None:
    boards, env = fleet
    board = boards[3]
    good = rollout(env, "--recipe", "sim-tiny-mtp", "--group", board.name)["succeeded"][board.name]["release"]
    broken = variant(tmp_path, extra_args=["--no-such-flag"])
    report = rollout(env, "--recipe", broken, "--group", board.name, "--strategy", "in-place",
                     "--health-timeout", "20", ok=False)
    reason = report["failed"][board.name]["reason"]
    assert "failed its health check" in reason and f"rolled back to {good}" in reason, reason
    assert os.readlink(board.base / "current") == f"releases/{good}"
    assert (board.base / "serving").read_text().strip() == good
    assert complete(board.service_port)["tokens_predicted"] > 0


def test_status_and_rollback(fleet, tmp_path: Path) -> None:
    boards, env = fleet
    board = boards[1]
    first = rollout(env, "--recipe", "sim-tiny-mtp", "--group", board.name)["succeeded"][board.name]["release"]
    second = rollout(env, "--recipe", variant(tmp_path, draft_n_max=2), "--group", board.name)
    assert second["changed"] == [board.name]
    res = edgekit("--json", "fleet", "rollback", "--group", board.name, "--to", first, env=env, timeout=900)
    assert res.returncode == 0, res.stderr[-2000:]
    back = json.loads(res.stdout)["succeeded"][board.name]
    assert back["release"] == first and back["previous"] == second["succeeded"][board.name]["release"]
    assert back["health"]["ok"]
    status = json.loads(edgekit("--json", "fleet", "status", "--group", board.name, env=env,
                                timeout=900).stdout)["boards"]
    row = status[board.name]
    assert row["current"] == row["serving"] == first and row["recipe"] == "sim-tiny-mtp" and row["health"]["ok"]
    # Without --to: the newest release older than current (by age, as `edgekit rollback` picks it).
    older = row["releases"][: row["releases"].index(first)]
    res = edgekit("--json", "fleet", "rollback", "--group", board.name, env=env, timeout=900)
    if older:
        assert res.returncode == 0 and json.loads(res.stdout)["succeeded"][board.name]["release"] == older[-1]
    else:
        reason = json.loads(res.stdout)["failed"][board.name]["reason"]
        assert res.returncode == 2 and "has no earlier release" in reason


def test_unreachable_board_is_named_and_the_rest_proceeds(fleet, sim_session) -> None:
    boards, env = fleet
    file = Boards(Path(sim_session.env["EDGEKIT_CONFIG"]))
    data = file.load()
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        dead_port = s.getsockname()[1]
    ghost = data.boards[boards[0].name].model_copy(update={"port": dead_port})
    data.boards["fleettest-ghost"] = ghost
    data.groups["fleettest-pair"] = [boards[0].name, "fleettest-ghost"]
    file.save(data)
    try:
        report = rollout(env, "--recipe", "sim-tiny-mtp", "--group", "fleettest-pair", "--canary", boards[0].name,
                         ok=False)
        assert report["failed"]["fleettest-ghost"]["phase"] == "connect"
        assert "Cannot reach" in report["failed"]["fleettest-ghost"]["reason"]
        assert list(report["succeeded"]) == [boards[0].name]
    finally:
        file.update(remove=["fleettest-ghost"])
        data = file.load()
        data.groups.pop("fleettest-pair", None)
        file.save(data)


def test_an_upload_the_board_cannot_unpack_fails_that_board_and_places_nothing(fleet, sim_session) -> None:
    """The last tar stream and the check of the uploads share one command (the agent's place --tar): a stream the
    board cannot unpack fails the board with the reason, and nothing reaches the store or a release; once the
    cause is gone, the next rollout completes it."""
    boards, env = fleet
    (victim,) = sim_session.boards(1, fresh=True)
    rollout(env, "--recipe", "sim-tiny-mtp", "--group", boards[0].name, "--no-canary")
    files = json.loads((boards[0].base / "current" / "release.json").read_text())["files"]
    sha = next(f["sha256"] for p, f in sorted(files.items()) if p != "units.json")
    blocker = victim.base / "store" / f"{sha}.part"  # a non-empty directory where an upload should land
    blocker.mkdir(parents=True)
    (blocker / "keep").write_text("not a blob\n")
    report = rollout(env, "--recipe", "sim-tiny-mtp", "--group", victim.name, "--no-canary", ok=False)
    reason = report["failed"][victim.name]["reason"]
    assert f"unpacking {sha}.part into {victim.base / 'store'} failed: Is a directory" in reason, reason
    assert not (victim.base / "current").exists() and not (victim.base / "releases").exists()
    assert not [p.name for p in (victim.base / "store").iterdir() if not p.name.endswith(".part")]
    shutil.rmtree(blocker)
    again = rollout(env, "--recipe", "sim-tiny-mtp", "--group", victim.name, "--no-canary")
    row = again["succeeded"][victim.name]
    push = row["push"]  # the failed run placed nothing: every blob is sent again
    assert row["health"]["ok"] and push["skipped_blobs"] == 0 and push["sent_blobs"] == push["missing_blobs"] > 0
    assert os.readlink(victim.base / "current") == f"releases/{row['release']}"


def test_a_blob_rotted_at_rest_on_a_board_is_caught_before_activation_and_taken_anew(fleet, tmp_path: Path) -> None:
    # Not a site's seed: any board. Its store's copy of the model rots (one byte, size and mtime kept); the next
    # rollout activates a release made of that blob, so the board hashes what it has first and takes it anew.
    boards, env = fleet
    board = boards[2]
    rollout(env, "--recipe", "sim-tiny-mtp", "--group", board.name)
    files = json.loads((board.base / "current" / "release.json").read_text())["files"]
    sha = max({f["sha256"] for f in files.values()}, key=lambda s: (board.base / "store" / s).stat().st_size)
    stored = board.base / "store" / sha
    stat = stored.stat()
    with open(stored, "r+b") as fh:
        fh.seek(stat.st_size // 2)
        byte = fh.read(1)
        fh.seek(stat.st_size // 2)
        fh.write(bytes([byte[0] ^ 0xFF]))
    os.utime(stored, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    report = rollout(env, "--recipe", variant(tmp_path, draft_n_max=4), "--group", board.name)  # a new release
    row = report["succeeded"][board.name]
    assert row["push"]["corrupt_blobs"] == 1 and row["push"]["sent_blobs"] >= 1 and row["push"]["rechecked_bytes"] > 0
    assert sha256_file(stored) == sha and row["health"]["ok"]
    assert faults.violations(board) == []


def test_deploy_and_ansible_leave_identical_boards(sim_session) -> None:
    (board,) = sim_session.boards(1, fresh=True)
    env = {**os.environ, **sim_session.env, "EDGEKIT_LLAMA_SRC": str(sdist_or_skip())}
    res = edgekit("--json", "deploy", "--board", board.name, "--recipe", "sim-tiny-mtp", env=env, timeout=900)
    assert res.returncode == 0, res.stderr[-2000:]
    deployed = json.loads(res.stdout)["release"]
    by_deploy = snapshot(board)
    # Wipe the board (service stopped, releases, store and units gone), then let Ansible do it.
    assert board.run("systemctl stop edgekit-serve.service").rc == 0
    shutil.rmtree(board.base)
    units = board.root / "etc" / "systemd" / "system"
    for path in units.rglob("edgekit-serve*"):
        path.unlink()
    report = rollout(env, "--recipe", "sim-tiny-mtp", "--group", board.name)
    assert report["succeeded"][board.name]["release"] == deployed
    by_ansible = snapshot(board)
    assert by_ansible == by_deploy
    assert (board.base / "current" / "release.json").is_file()
    # And each tool takes the other's work as current.
    again = edgekit("--json", "deploy", "--board", board.name, "--recipe", "sim-tiny-mtp", env=env, timeout=900)
    assert again.returncode == 0 and not json.loads(again.stdout)["changed"]


def _is_playbook(proc: psutil.Process) -> bool:
    try:
        return "ansible-playbook" in " ".join(proc.cmdline()[:2])
    except psutil.Error:  # an ssh that has just ended
        return False


def test_a_killed_rollout_keeps_its_boards_locked_until_its_playbook_has_finished_them(sim_session) -> None:
    # SIGKILL (a CI timeout, the OOM killer) ends edgekit, not the playbook it started: that playbook must not
    # die at its next output line (leaving the board between two tasks), and no deploy may take the board while
    # it still works there. It finishes the rollout under the lock, which is free once it has ended.
    from edgekit.remote import mux

    (board,) = sim_session.boards(1, fresh=True)
    env = {**os.environ, **sim_session.env, "EDGEKIT_LLAMA_SRC": str(sdist_or_skip())}
    run = subprocess.Popen([*EDGEKIT, "fleet", "rollout", "--recipe", "sim-tiny-mtp",
                            "--group", board.name, "--no-canary"], env=env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    edgekit_proc, playbook = psutil.Process(run.pid), None
    while playbook is None:
        assert run.poll() is None, "the rollout ended before its playbook started"
        playbook = next((c for c in edgekit_proc.children() if _is_playbook(c)), None)
        time.sleep(0.01)
    playbook.suspend()  # held where it is, so the deploy below meets it mid-run
    control = Path(playbook.environ()["ANSIBLE_SSH_CONTROL_PATH_DIR"])
    work = Path(playbook.cmdline()[playbook.cmdline().index("-i") + 1]).parent
    try:
        run.kill()
        run.wait()
        res = edgekit("deploy", "--board", board.name, "--recipe", "sim-tiny-mtp", env=env, timeout=900)
        assert res.returncode != 0 and "Another deploy holds board" in res.stderr, res.stderr[-2000:]
    finally:
        playbook.resume()
    try:
        playbook.wait(600)
        release = (board.base / "serving").read_text().strip()  # finished: activated, serving, switched
        assert os.readlink(board.base / "current") == f"releases/{release}"
        assert complete(board.service_port)["tokens_predicted"] > 0
        again = edgekit("--json", "deploy", "--board", board.name, "--recipe", "sim-tiny-mtp", env=env,
                        timeout=900)  # lock free
        assert again.returncode == 0, again.stderr[-2000:]
        assert json.loads(again.stdout)["release"] == release and not json.loads(again.stdout)["changed"]
    finally:
        mux.close_masters(control)  # the killed run's: its owner is gone
        shutil.rmtree(control, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)


def test_ansible_rolls_out_litert_lm_and_vllm_releases_health_checks_them_and_rolls_back(sim_session,
                                                                                         tmp_path: Path) -> None:
    """Every engine's release through the same roles: the board-side health check speaks the engine's
    dialect (llama-style /completion for LiteRT-LM's front, /v1/completions + /metrics for vLLM), each with the
    board's API key (runtime.auth: key: the front reads its file, vLLM its unit's environment file)."""
    pair = sim_session.boards(2, fresh=True)
    env = {**os.environ, **sim_session.env}
    file = Boards(Path(sim_session.env["EDGEKIT_CONFIG"]))
    data = file.load()
    data.groups["fleettest-engines"] = [b.name for b in pair]
    file.save(data)
    try:
        lit = rollout(env, "--recipe", keyed(tmp_path, "sim-tiny-mtp-litert"), "--group", "fleettest-engines")
        assert sorted(lit["changed"]) == sorted(b.name for b in pair)
        for b in pair:
            health = lit["succeeded"][b.name]["health"]
            assert health["ok"] and health["draft_n"] > 0 and health["acceptance"] > 0.2, health
            assert health["method"] == "chat completion", health  # through the bundle's template, on the board
            manifest = json.loads((b.base / "current" / "release.json").read_text())
            assert manifest["engine"] == "litert-lm" and manifest["chat"]
            assert guarded(b, "/props") == (401, 200)
        board = pair[0]
        vl = rollout(env, "--recipe", keyed(tmp_path, "sim-tiny-mtp-vllm"), "--group", board.name)
        health = vl["succeeded"][board.name]["health"]
        assert health["ok"] and health["draft_n"] > 0 and health["acceptance"] > 0.2, health  # from /metrics
        assert guarded(board, "/v1/models") == (401, 200)
        status = json.loads(edgekit("--json", "fleet", "status", "--group", board.name, env=env,
                                    timeout=900).stdout)["boards"]
        assert status[board.name]["recipe"] == "sim-tiny-mtp-vllm" and status[board.name]["health"]["ok"]
        res = edgekit("--json", "fleet", "rollback", "--group", board.name, env=env, timeout=900)
        assert res.returncode == 0, res.stderr[-2000:]
        back = json.loads(res.stdout)["succeeded"][board.name]
        assert back["release"] == lit["succeeded"][board.name]["release"] and back["health"]["draft_n"] > 0
    finally:
        data = file.load()
        data.groups.pop("fleettest-engines", None)
        file.save(data)


def keyed(tmp: Path, name: str) -> str:
    """The built-in recipe ``name`` with runtime.auth: key (on the board's loopback, as it is)."""
    data = yaml.safe_load((REPO / "edgekit" / "data" / "recipes" / f"{name}.yaml").read_text())
    data["runtime"]["auth"] = "key"
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def guarded(board: SimBoard, path: str) -> tuple[int, int]:
    """The statuses of GET ``path`` on the board's service without its key and with it."""
    key = (board.base / "keys" / "api.key").read_text().strip()
    out = []
    for headers in ({}, {"Authorization": f"Bearer {key}"}):
        try:
            with urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{board.service_port}{path}",
                                                               headers=headers), timeout=60) as resp:
                out.append(resp.status)
        except urllib.error.HTTPError as exc:
            out.append(exc.code)
    return out[0], out[1]


def test_ansible_health_checks_the_published_structure_through_its_template_with_an_image_and_audio(
        sim_session) -> None:
    """The board-side health check (HEALTH_PY) speaks what the host's does: a chat-templated completion and,
    for a release with an mmproj, one image and one second of audio, each answered."""
    (board,) = sim_session.boards(1, fresh=True)
    env = {**os.environ, **sim_session.env}
    out = rollout(env, "--recipe", "sim-e2b-mtp", "--group", board.name)  # llama.cpp: its GGUFs, not the bundle
    health = out["succeeded"][board.name]["health"]
    assert health["ok"] and health["draft_n"] > 0 and health["method"] == "chat completion", health
    assert set(health["media"]) == {"image", "audio"}
    assert all(m["ok"] and m["ttft_ms"] > 0 and m["prompt_tokens"] > 20 for m in health["media"].values()), health
    manifest = json.loads((board.base / "current" / "release.json").read_text())
    assert manifest["media"] == ["image", "audio"] and manifest["chat"] is True


def test_state_handed_to_the_playbook_is_what_the_agent_s_state_verb_reads(fleet, sim_session,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    # `fleet rollout` reads each board's release state under its lock and hands it to the playbook instead of
    # the agent's `state` (the status and rollback plays' first task): both must say the same, on a fresh board
    # and on one that serves a release.
    from rich.console import Console

    from edgekit.config.recipes import load_recipe
    from edgekit.deploy.pipeline import DeployOptions
    from edgekit.fleet.connect import Fleet
    from edgekit.fleet.current import already_current
    from edgekit.fleet.plan import plan_fleet
    from edgekit.release.units import UNIT_NAME
    from edgekit.remote import agent_call

    boards, env = fleet
    for key in ("EDGEKIT_CONFIG", "EDGEKIT_LLAMA_SRC", *sim_session.env):
        monkeypatch.setenv(key, env[key])
    (fresh,), serving = sim_session.boards(1, fresh=True), boards[3]  # a board nothing was rolled out to
    rollout(env, "--recipe", "sim-tiny-mtp", "--group", serving.name, "--no-canary")
    data = Boards(Path(sim_session.env["EDGEKIT_CONFIG"])).load()
    fields = ("current", "serving", "releases", "has_release", "active", "sudo")

    with Fleet({b.name: data.boards[b.name] for b in (fresh, serving)}) as fl:
        fp = plan_fleet(load_recipe("sim-tiny-mtp"), fl.targets, DeployOptions(), Console(quiet=True))
        found, unread = already_current(fl, fp)
        assert not unread, unread
        for b in (fresh, serving):
            bp = fp.boards[b.name]
            read = agent_call.call(fl.targets[b.name].runner, bp.base, "state", bp.base, "--release",
                                   bp.plan.release_id, "--unit", UNIT_NAME)
            state = found[b.name].state
            assert {k: state[k] for k in fields} == {k: read[k] for k in fields}, b.name
            assert set(state) == {*fields, "serves"}
            assert state["serves"] == (read["active"] and read["current"] == read["serving"] == bp.plan.release_id)
    assert found[serving.name].state["active"] and found[serving.name].state["has_release"]
    assert found[serving.name].report is not None and found[fresh.name].report is None
    assert not found[fresh.name].state["releases"] and not found[fresh.name].state["active"]


def test_a_release_that_asks_for_a_key_rolls_out_with_each_board_s_own_which_no_plan_or_log_holds(
        fleet, tmp_path: Path) -> None:
    boards, env = fleet
    keyed = variant(tmp_path, host="0.0.0.0", auth="key")
    report = rollout(env, "--recipe", keyed, *_group(), "--batch", "100%")
    names = [b.name for b in boards]
    assert sorted(report["succeeded"]) == sorted(names) and not report["failed"], report
    keys = {}
    for b in boards:
        keys[b.name] = (Path(env["EDGEKIT_CONFIG_DIR"]) / "keys" / f"{b.name}.key").read_text().strip()
        assert (b.base / "keys" / "api.key").read_text().strip() == keys[b.name]
        assert report["succeeded"][b.name]["health"]["draft_n"] > 0  # the roles' check sent the key
        body = json.dumps({"prompt": "Hello", "n_predict": 4}).encode()
        for key, want in ((None, 401), (keys[b.name], 200)):
            headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
            req = urllib.request.Request(f"http://127.0.0.2:{b.service_port}/completion", body, headers)
            try:
                with urllib.request.urlopen(req, timeout=60) as resp:
                    assert resp.status == want
            except urllib.error.HTTPError as exc:
                assert exc.code == want, b.name
    assert len(set(keys.values())) == len(boards)  # one key per board
    logs = Path(report["log"]).read_text() + json.dumps(report)
    assert not [n for n, k in keys.items() if k in logs]
    back = rollout(env, "--recipe", "sim-tiny-mtp", *_group(), "--batch", "100%")
    assert sorted(back["succeeded"]) == sorted(names) and not back["failed"]
