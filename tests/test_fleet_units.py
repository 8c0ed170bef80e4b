"""edgekit fleet without boards: inventory, batches, the plan file, the summary, ansible-lint."""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from edgekit.cli import cli
from edgekit.config.boardfile import Board, BoardFile
from edgekit.errors import EdgekitError
from edgekit.fleet import inventory as inv
from edgekit.fleet.playbook import ansible_dir, dump_vars, largest_batch, parse_batches
from edgekit.fleet.report import summarize
from edgekit.fleet.rollout import choose_canary, run_inventory

REPO = Path(__file__).resolve().parents[1]
ANSIBLE_PLAYBOOK = Path(sys.executable).with_name("ansible-playbook")


def _board_file(tmp_path: Path) -> BoardFile:
    key = tmp_path / "id_ed25519"
    key.write_text("not a key")
    return BoardFile(
        boards={
            "orin-1": Board(host="192.0.2.10", user="nvidia", key=str(key), profile="orin",
                            known_hosts=str(tmp_path / "kh")),
            "orin-2": Board(host="192.0.2.11", port=2222, user="nvidia", profile="orin-nx-16gb", service_port=9000,
                            known_hosts=str(tmp_path / "kh")),
            "thor-1": Board(host="thor.lab", user="ubuntu", profile="thor", base="/opt/edgekit",
                            known_hosts=str(tmp_path / "kh")),
        },
        groups={"canary": ["orin-2"], "site-a.lab": ["orin-1", "orin-2"]},
    )


def test_inventory_has_every_board_fact_and_strict_host_keys(tmp_path: Path) -> None:
    data = _board_file(tmp_path)
    rendered = inv.render(data)
    hosts = rendered["all"]["hosts"]
    assert set(hosts) == {"orin-1", "orin-2", "thor-1"}
    h = hosts["orin-2"]
    assert (h["ansible_host"], h["ansible_port"], h["ansible_user"]) == ("192.0.2.11", 2222, "nvidia")
    assert h["edgekit_profile"] == "orin-nx-16gb" and h["edgekit_base"] == "~/edgekit"
    assert hosts["thor-1"]["edgekit_profile"] == "thor-agx-128gb"  # aliases resolved
    assert h["edgekit_service_port"] == 9000 and "ansible_ssh_private_key_file" not in h
    args = hosts["orin-1"]["ansible_ssh_common_args"]
    assert f"UserKnownHostsFile={tmp_path / 'kh'}" in args and "StrictHostKeyChecking=yes" in args
    assert "GlobalKnownHostsFile=/dev/null" in args and "IdentitiesOnly=yes" in args
    assert "KexAlgorithms=curve25519-sha256," in args  # not OpenSSH 9's costly sntrup761 first
    assert hosts["orin-1"]["ansible_ssh_private_key_file"] == str(tmp_path / "id_ed25519")
    children = rendered["all"]["children"]
    assert set(children["site-a.lab"]["hosts"]) == {"orin-1", "orin-2"}
    assert set(children["profile_thor_agx_128gb"]["hosts"]) == {"thor-1"}
    with_canary = run_inventory(data, ["orin-1", "orin-2"], choose_canary(data, ["orin-1", "orin-2"], None))
    assert set(with_canary["all"]["hosts"]) == {"orin-1", "orin-2"}
    assert list(with_canary["all"]["children"]["edgekit_canary"]["hosts"]) == ["orin-2"]


def test_canary_and_selection_rules(tmp_path: Path) -> None:
    data = _board_file(tmp_path)
    assert inv.select(data, "site-a.lab") == ["orin-1", "orin-2"]
    assert inv.select(data, "thor-1") == ["thor-1"]
    with pytest.raises(EdgekitError, match="neither a group nor a board"):
        inv.select(data, "nope")
    assert choose_canary(data, ["orin-1", "orin-2"], None) == ["orin-2"]  # the `canary` group
    assert choose_canary(data, ["orin-1", "thor-1"], None) == ["orin-1"]  # else the first board
    assert choose_canary(data, ["orin-1", "thor-1"], "thor-1") == ["thor-1"]
    assert choose_canary(data, ["orin-1"], None, none=True) == []
    with pytest.raises(EdgekitError, match="names none of the boards"):
        choose_canary(data, ["thor-1"], "site-a.lab")


def test_batches_and_forks() -> None:
    assert parse_batches("1, 25%,100%") == [1, "25%", "100%"]
    for bad in ("0", "150%", "x", ""):
        with pytest.raises(EdgekitError):
            parse_batches(bad)
    assert largest_batch([1, "25%", "100%"], 7) == 7
    assert largest_batch([2, "10%"], 3) == 2
    assert largest_batch(["25%"], 2) == 1  # Ansible: int(25% of 2) = 0 → at least 1


def test_inventory_command_renders_yaml_ansible_reads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "edgekit.yaml"
    raw = _board_file(tmp_path).model_dump(exclude_defaults=True)
    cfg.write_text(yaml.safe_dump(raw))
    monkeypatch.setenv("EDGEKIT_CONFIG", str(cfg))
    res = CliRunner().invoke(cli, ["fleet", "inventory", "--group", "site-a.lab"])
    assert res.exit_code == 0, res.output
    text = res.output
    assert yaml.safe_load(text)["all"]["children"]["edgekit_canary"]["hosts"] == {"orin-2": None}
    res = CliRunner().invoke(cli, ["--json", "fleet", "inventory"])
    assert set(json.loads(res.output)["all"]["hosts"]) == {"orin-1", "orin-2", "thor-1"}
    tool = Path(sys.executable).with_name("ansible-inventory")
    if not tool.is_file():
        pytest.skip("ansible-core is not installed (pip install 'ansible-core==2.19.*')")
    path = tmp_path / "inventory.yml"
    path.write_text(text)
    listed = subprocess.run([str(tool), "-i", str(path), "--list"], capture_output=True, text=True, check=True,
                            env={"ANSIBLE_CONFIG": str(ansible_dir() / "ansible.cfg"), "PATH": "/usr/bin:/bin"})
    parsed = json.loads(listed.stdout)
    assert parsed["_meta"]["hostvars"]["orin-2"]["ansible_port"] == 2222
    assert sorted(parsed["edgekit_canary"]["hosts"]) == ["orin-2"]


def test_plan_file_strings_are_never_templated(tmp_path: Path) -> None:
    """Paths and scripts reach Ansible as unsafe strings: a `{{ }}` in a base dir stays text."""
    if not ANSIBLE_PLAYBOOK.is_file():
        pytest.skip("ansible-core is not installed (pip install 'ansible-core==2.19.*')")
    plan = tmp_path / "plan.json"
    plan.write_text(dump_vars({"x": "{{ 6 * 7 }} $(touch pwned) 'q' \"d\"", "n": 3, "l": ["{{ 1 }}", True]}))
    play = tmp_path / "play.yml"
    play.write_text(yaml.safe_dump([{"name": "p", "hosts": "localhost", "gather_facts": False, "tasks": [
        {"name": "show", "ansible.builtin.debug": {"msg": "{{ [x, n, l] | to_json }}"}}]}]))
    res = subprocess.run([str(ANSIBLE_PLAYBOOK), str(play), "-e", f"@{plan}", "-i", "localhost,", "-c", "local"],
                         capture_output=True, text=True, cwd=tmp_path, check=False,
                         env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "ANSIBLE_NOCOLOR": "1"})
    assert res.returncode == 0, res.stdout[-2000:]
    assert "{{ 6 * 7 }} $(touch pwned)" in res.stdout and "42" not in res.stdout
    assert not (tmp_path / "pwned").exists()


def test_summary_names_failed_succeeded_and_untouched() -> None:
    report = {"stopped": True, "hosts": {
        "a": {"touched": True, "stats": {"failures": 0}, "data": {"edgekit": {"release": "r", "changed": True}}},
        "b": {"touched": True, "stats": {"failures": 1}, "failures": [{"task": "t", "msg": "boom"}],
              "data": {"edgekit": {"release": "r", "failed": True, "reason": "Release r failed its health check"}}},
        "c": {"touched": True, "stats": {"unreachable": 1}, "unreachable": "no route"},
    }}
    s = summarize("rollout", ["a", "b", "c", "d", "e"], report, {"e": "Cannot reach board 'e'"})
    assert list(s.succeeded) == ["a"] and s.changed == ["a"]
    assert s.failed["b"]["reason"].startswith("Release r failed") and s.failed["c"]["reason"] == "unreachable: no route"
    assert s.failed["e"]["phase"] == "connect" and s.untouched == ["d"] and s.stopped and not s.ok
    assert "1 succeeded (1 changed), 3 failed, 1 untouched" in s.headline()


def test_ansible_lint_production_profile_is_clean() -> None:
    lint = shutil.which("ansible-lint") or str(Path(sys.executable).with_name("ansible-lint"))
    if not Path(lint).is_file():
        pytest.skip("ansible-lint is not installed (pip install ansible-lint)")
    res = subprocess.run([lint, "--offline", "--nocolor"], cwd=REPO / "edgekit" / "data" / "ansible",
                         capture_output=True, text=True, timeout=300, check=False)
    assert res.returncode == 0, (res.stdout + res.stderr)[-3000:]
    assert "production" in res.stdout + res.stderr


def test_activation_report_reads_the_registered_results_and_names_unfinished_boards() -> None:
    from edgekit.fleet.report import activation_report

    fresh = {"release": "r2", "strategy": "candidate",
             "state": {"current": None, "active": False, "has_release": False}}
    serving = {"release": "r2", "strategy": "candidate",
               "state": {"current": "r2", "active": True, "has_release": True}}
    healthy = json.dumps({"ok": True, "reason": "healthy", "draft_n": 4})
    sick = json.dumps({"ok": False, "reason": "no tokens"})
    push = {"sent_blobs": 3, "sent_bytes": 900, "skipped_blobs": 1, "missing_blobs": 3, "missing_bytes": 900,
            "rechecked_bytes": 0, "corrupt_blobs": 0}

    def out(*lines: str) -> dict:
        return {"edgekit_service_out": {"stdout": "".join(line + "\n" for line in lines), "rc": 0}}

    started = activation_report(fresh, {"edgekit_release_push": push, **out("begin main", f"main {healthy}")}, False)
    assert started is not None and started["changed"] and started["health"]["draft_n"] == 4
    assert started["strategy"] == "in-place" and started["previous"] is None  # nothing served: no candidate
    assert started["push"] == push and started["would_create_release"] and started["would_activate"]
    # The play stopped after the push, before the service started: not a success.
    assert activation_report(fresh, {"edgekit_release_push": push}, False) is None
    # --check: the push's check is all that runs for a board that serves nothing.
    checked = activation_report(fresh, {"edgekit_release_push": push}, True)
    assert checked is not None and not checked["changed"] and checked["would_activate"] and checked["health"] is None
    # A board already serving the release, found healthy by the full check: left alone.
    kept = activation_report(serving, {"edgekit_release_push": {"skipped_blobs": 4}, **out(f"current {healthy}")},
                             False)
    assert kept is not None and not kept["changed"] and not kept["would_activate"] and kept["health"]["ok"]
    assert kept["strategy"] == "candidate" and kept["previous"] == "r2" and kept["push"]["sent_bytes"] == 0
    # ... and one whose full check failed but whose activation did not finish: not a success either.
    assert activation_report(serving, out(f"current {sick}", "begin candidate"), False) is None


def test_activation_reads_each_step_and_the_step_that_decides() -> None:
    from edgekit.fleet.commands import activation

    ok, bad = json.dumps({"ok": True}), json.dumps({"ok": False, "reason": "no tokens"})
    healthy_current = activation(f"current {ok}\n")
    assert healthy_current["ok"] and healthy_current["begun"] == [] and healthy_current["log"] == "main"
    cand_failed = activation(f"current {bad}\nbegin candidate\ncandidate {bad}\n")
    assert not cand_failed["ok"] and cand_failed["log"] == "candidate" and cand_failed["candidate"]["reason"]
    # The candidate passed but the service's start failed before its check printed: not ok, its log.
    half = activation(f"begin candidate\ncandidate {ok}\nbegin main\n")
    assert not half["ok"] and half["main"] is None and half["log"] == "main" and half["begun"][-1] == "main"
    # A candidate that passed with nothing after it (the command was cut off) is no success.
    assert not activation(f"begin candidate\ncandidate {ok}\n")["ok"]
    assert activation(f"begin candidate\ncandidate {ok}\nbegin main\nmain {ok}\n")["ok"]
    assert activation("") == {"current": None, "candidate": None, "main": None, "begun": [], "ok": False,
                              "log": "main", "finished": False}
    # The program's result decides once it printed one (it put the previous release back itself on a failure).
    done = activation(f"begin main\nmain {bad}\nresult " + json.dumps({"ok": False, "restored": "r1"}) + "\n")
    assert done["finished"] and not done["ok"] and done["main"]["reason"] == "no tokens"
    assert activation(f"begin main\nmain {ok}\nresult " + json.dumps({"ok": True}) + "\n")["finished"]
    assert not activation(f"begin main\nmain {ok}\n")["finished"]  # cut off before its result: the rescue's


def test_rollout_commands_quote_every_value_and_follow_the_plan(tmp_path: Path) -> None:
    """The activation for a board serving another release has a candidate step and no first check; every
    value reaches the board as one argument, whatever it contains; the shell accepts the whole line."""
    from edgekit.fleet import commands
    from edgekit.fleet.plan import fleet_vars

    fleet = fleet_vars(30.0)
    base = str(tmp_path / "it's a $base; `x`")
    plan = {"release": "r2", "base": base, "port": 8080, "candidate_port": 8081, "drafter": True,
            "strategy": "candidate", "keep": 2, "engine": "llama.cpp", "model": "sim-tiny-mtp", "gpu": "none",
            "chat": False, "media": "",
            "state": {"current": "r1", "serving": "r1", "active": True, "serves": False, "sudo": ["sudo", "-n"]}}
    line = commands.rollout(plan, fleet, "activate")
    argv = shlex.split(line)  # the board's own activation program, every value one argument
    # -B: running the program writes no bytecode into the release it comes from
    assert argv[:4] == ["python3", "-B", f"{base}/releases/r2/agent/edgekit_agent.py", "activate"]
    opts = dict(zip(argv[4::2], argv[5::2], strict=False))
    assert (opts["--base"], opts["--release"], opts["--strategy"], opts["--candidate-port"]) == (
        base, "r2", "candidate", "8081")
    assert "--check-first" not in argv and "--drafter" in argv
    assert subprocess.run(["sh", "-n", "-c", line], check=False).returncode == 0
    words = shlex.split(commands.rollout(plan, fleet, "restore_switch"))
    # the rescue of an activation that did not finish: the agent's release-switch, as one command
    assert words[-2:] == [base, "r1"] and words[0] == "python3" and words[2:4] == ["release-switch", "--serving"]
    restore = shlex.split(commands.rollout(plan, fleet, "restore"))  # the release's agent installs its unit's spec
    r1 = f"{base}/releases/r1"
    assert restore[:10] == ["python3", "-B", f"{r1}/agent/edgekit_agent.py", "unit-install", "--base", base,
                            "--release", "r1", "--unit", "edgekit-serve.service"]
    assert restore[-1] == "edgekit-serve.service" and "restart" in restore
    serving = {**plan, "state": {**plan["state"], "current": "r2", "serving": "r2", "serves": True}}
    again = shlex.split(commands.rollout(serving, fleet, "activate"))
    assert "--check-first" in again and again[again.index("--strategy") + 1] == "candidate"
    check = shlex.split(commands.rollout(serving, fleet, "check"))  # the agent's health verb, and nothing else
    assert check[2] == "health" and "begin" not in check and check[check.index("--port") + 1] == "8080"
    seen = commands.checked('{"ok": true, "reason": "healthy"}\n')
    assert seen["ok"] and seen["current"]["reason"] == "healthy" and not seen["begun"] and seen["log"] == "main"
    assert not commands.checked("")["ok"]
    fresh = {**plan, "state": {"current": None, "serving": None, "active": False, "serves": False, "sudo": []}}
    first = shlex.split(commands.rollout(fresh, fleet, "activate"))
    assert first[first.index("--strategy") + 1] == "in-place" and first[first.index("--candidate-port") + 1] == "0"
    # A rollback runs the program of the release serving now, else the target's; neither: one sentence.
    manifest = {"engine": "llama.cpp", "port": 8080, "drafter": True}
    st = {"base": base, "current": "r2", "sudo": [], "programs": ["r2"]}
    back = shlex.split(commands.on_board(st, fleet, "rollback", "r1", manifest))
    assert back[:4] == ["python3", "-B", f"{base}/releases/r2/agent/edgekit_agent.py", "rollback"]
    assert back[back.index("--release") + 1] == "r1" and "--drafter" in back
    own = shlex.split(commands.on_board({**st, "programs": ["r1"]}, fleet, "rollback", "r1", manifest))
    assert own[2] == f"{base}/releases/r1/agent/edgekit_agent.py"
    with pytest.raises(ValueError, match="predate it"):
        commands.on_board({**st, "programs": []}, fleet, "rollback", "r1", manifest)


@pytest.mark.parametrize("chunked", [False, True])
def test_board_health_check_reads_fixed_length_and_chunked_answers(chunked: bool, agent_pyz: Path) -> None:
    """The board's health check (the agent's `health` verb) speaks HTTP itself (no http.client): a
    completion answered in chunks or with a Content-Length reads the same, /health is polled until it answers
    200, and a server that answers an error is reported with its status."""
    import http.server
    import threading

    from edgekit.agent.health import command_args

    seen: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def _send(self, status: int, body: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            if chunked:
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                for at in range(0, len(body), 7):
                    part = body[at:at + 7]
                    self.wfile.write(f"{len(part):x}\r\n".encode() + part + b"\r\n")
                self.wfile.write(b"0\r\n\r\n")
            else:
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        def do_GET(self) -> None:
            seen.append(self.path)
            self._send(503 if seen.count("/health") < 3 else 200, b'{"status": "ok"}')

        def do_POST(self) -> None:
            payload = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append(f"{self.path} {payload['n_predict']}")
            if payload["prompt"] == "fail":
                self._send(500, b'{"error": "boom"}')
                return
            self._send(200, json.dumps({"content": " hello" * 40, "tokens_predicted": 5,
                                        "timings": {"predicted_n": 5, "predicted_per_second": 12.5, "draft_n": 4,
                                                    "draft_n_accepted": 3}}).encode())

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        def check(prompt: str) -> dict:
            args = command_args(server.server_address[1], drafter=True, timeout=10, n_predict=5, prompt=prompt,
                                unit="edgekit-test.service", api="llama", model="", gpu="none", log="", chat=False,
                                media=[])
            argv = [sys.executable, str(agent_pyz), "health", *args]
            return json.loads(subprocess.run(argv, capture_output=True, text=True, check=True, timeout=60).stdout)

        good = check("hi")
        assert good["ok"] and good["tokens"] == 5 and good["draft_n"] == 4 and good["acceptance"] == 0.75, good
        assert seen.count("/health") == 3 and "/completion 5" in seen
        bad = check("fail")
        assert not bad["ok"] and "answered 500" in bad["reason"] and "boom" in bad["reason"], bad
    finally:
        server.shutdown()
        server.server_close()


def test_a_release_of_an_engine_this_edgekit_does_not_know_is_one_sentence_not_a_guessed_dialect() -> None:
    from edgekit.fleet import commands
    from edgekit.fleet.plan import fleet_vars

    board = commands.Board(fleet_vars(30.0), "/opt/edgekit")
    assert "--api openai" in board.health("edgekit-serve.service", commands.Serve(8080, engine="vllm"))
    with pytest.raises(ValueError, match=r"engine 'plain' is not one this edgekit knows .*EDGEKIT_ENGINES"):
        board.health("edgekit-serve.service", commands.Serve(8080, engine="plain"))


def test_a_site_board_pulls_from_the_seed_then_from_boards_of_earlier_batches() -> None:
    from edgekit.fleet.sites import MORE_SOURCES, SiteReport, Staged, _sources

    order = [f"b{i}" for i in range(12)]
    urls = {b: f"http://{b}:8089" for b in order}
    serving = [b for b in order if b != "b2"]  # b2's nginx did not start: never a source
    assert _sources(order, "b0", serving, urls, "b1") == ["http://b0:8089"]
    assert _sources(order, "b0", serving, urls, "b4") == ["http://b0:8089", "http://b1:8089", "http://b3:8089"]
    far = _sources(order, "b0", serving, urls, "b11")
    assert far[0] == "http://b0:8089" and len(far) == 1 + MORE_SOURCES and "http://b2:8089" not in far
    # A seed that is not first in the order (the canary was elsewhere) is tried first all the same.
    assert _sources(order, "b3", serving, urls, "b4")[:2] == ["http://b3:8089", "http://b0:8089"]

    # The report takes each pulling board's summary from what the playbook's edgekit_blobs registered.
    staged = Staged(reports={"lab": SiteReport("lab", ["b0", "b1", "b2", "b3"], seed="b0")},
                    pulls={b: {"sources": [urls["b0"]]} for b in ("b1", "b2", "b3")})
    pulled = {"bytes": 10, "blobs": 1, "sources": {urls["b0"]: 1}, "missing": []}
    hosts = {"b0": {"registered": {"edgekit_release_push": {"sent_bytes": 0}}},
             "b1": {"registered": {"edgekit_release_push": {"site": pulled}}},
             "b2": {"registered": {"edgekit_release_push": {"missing_blobs": 0}}},  # had everything: no pull
             # b3: the playbook never reached it (its canary failed)
             }
    boards = staged.collect(hosts)["lab"]["boards"]
    assert boards == {"b1": pulled, "b2": {"bytes": 0, "blobs": 0, "sources": {}, "missing": [],
                                             "rejected_copies": 0, "seconds": 0.0}}
