"""A board that serves to the network asks every client for its key (runtime.auth: key), and the key leaks nowhere.

A simulated board on loopback; 127.0.0.2 stands for another machine on the robot's network. edgekit makes the
key, keeps it in its config dir and on the board (0600), hands it to llama-server as a file, checks health and
benches with it, and replaces it (``edgekit board key rotate``) so that the old key is refused.
"""

from __future__ import annotations

import json
import os
import stat
import urllib.error
import urllib.request
from pathlib import Path

import openai
import openai_client
import pytest
from cli_helpers import edgekit
from openai_client import assert_answers
from test_deploy import boards, deploy, recipe_variant, status  # noqa: F401 - boards is a fixture

from edgekit.config import api_keys


def ask(port: int, path: str, key: str | None = None, body: dict | None = None, host: str = "127.0.0.2") -> int:
    """The HTTP status ``host`` gets for ``path`` (POST with ``body``), with ``key`` as its bearer."""
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(f"http://{host}:{port}{path}", data, headers)
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code


def completion(port: int, key: str | None) -> int:
    return ask(port, "/completion", key, {"prompt": "Hello", "n_predict": 4, "temperature": 0})


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def cmdlines() -> str:
    """Every process's command line on this machine (the simulated boards' processes are among them)."""
    out = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                out.append((proc / "cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace"))
            except OSError:
                continue
    return "\n".join(out)


def test_a_board_serving_to_the_network_asks_for_its_key_which_leaks_nowhere_and_rotates(
        boards, tmp_path: Path) -> None:  # noqa: F811 - the fixture
    (board,) = boards(1, fresh=True)
    port = board.service_port
    keyed = recipe_variant(tmp_path, "sim-tiny-mtp", "sim-tiny-mtp-keyed", host="0.0.0.0", auth="key")
    res = edgekit("--json", "deploy", "--board", board.name, "--recipe", str(keyed), timeout=900)
    assert res.returncode == 0, res.stderr[-2000:]
    report = json.loads(res.stdout)
    assert report["health"]["ok"] and report["health"]["draft_n"], report["health"]  # checked with the key

    # The key: made here, 0600 in a 0700 directory, and the same bytes on the board, 0600 in a 0700 directory.
    key_path = api_keys.key_file(board.name)
    key = key_path.read_text().strip()
    assert len(key) >= 40 and mode(key_path) == 0o600 and mode(key_path.parent) == 0o700
    on_board = board.base / "keys" / "api.key"
    assert on_board.read_text().strip() == key and mode(on_board) == 0o600 and mode(on_board.parent) == 0o700
    assert any(str(key_path) in note for note in report["notes"]), report["notes"]

    # Another machine gets nothing without the key (a wrong one included); /health stays open for probes;
    # /slots (other users' prompts) is off, /metrics is behind the key.
    assert completion(port, None) == 401 and completion(port, "not-the-key") == 401
    assert completion(port, key) == 200
    # The OpenAI client, as most clients are, with the key as its api_key (a wrong one refused).
    assert_answers(port, "sim-tiny-mtp-keyed", api_key=key, host="127.0.0.2")
    with pytest.raises(openai.AuthenticationError):
        openai_client.client(port, "not-the-key", "127.0.0.2").chat.completions.create(
            model="sim-tiny-mtp-keyed", messages=openai_client.MESSAGES, max_tokens=4)
    assert ask(port, "/health") == 200
    assert ask(port, "/metrics") == 401 and ask(port, "/metrics", key) == 200
    assert ask(port, "/slots", key) != 200

    # Nowhere else: not in release.json, the deploy's output, the server's log, the units, any command line.
    release = board.base / "releases" / report["release"]
    leaks = {"release.json": (release / "release.json").read_text(), "deploy stdout": res.stdout,
             "deploy stderr": res.stderr, "server log": (board.base / "logs" / "server.log").read_text(),
             "units": "".join(p.read_text() for p in (board.root / "etc/systemd/system").glob("edgekit-*")),
             "command lines": cmdlines()}
    assert not [where for where, text in leaks.items() if key in text]
    assert json.loads((release / "release.json").read_text())["api_key_file"] == str(on_board)

    # The bench measures the keyed server with the key (its load and its servers read the board's file).
    out = tmp_path / "bench"
    res = edgekit("bench", "--board", board.name, "--recipe", str(keyed), "--quick", "--concurrency", "1",
                  "--n-gen", "16", "--no-llama-bench", "--no-plots", "--out", str(out), timeout=900)
    assert res.returncode == 0, res.stderr[-2000:]
    runs = json.loads((out / "results.json").read_text())["runs"]
    assert runs and all(r["tokens_per_second"] > 0 and not r.get("errors") for r in runs)
    assert key not in (out / "results.json").read_text() + res.stdout + res.stderr

    # Rotation: a new key on both sides, the service restarted on it; the old key is refused after.
    res = edgekit("--json", "board", "key", "rotate", "--board", board.name, timeout=900)
    assert res.returncode == 0, res.stderr[-2000:]
    rotated = json.loads(res.stdout)
    new = key_path.read_text().strip()
    assert new != key and on_board.read_text().strip() == new and key not in res.stdout + res.stderr
    assert new not in res.stdout + res.stderr and rotated["release"] == report["release"]
    assert not list(key_path.parent.glob("*.new")) and mode(key_path) == 0o600
    assert completion(port, key) == 401 and completion(port, new) == 200
    assert status(board.name)["current"] == report["release"]

    # A workstation without the board's key is told so before anything changes on the board.
    aside = key_path.with_name("aside")
    os.replace(key_path, aside)
    try:
        other = recipe_variant(tmp_path, "sim-tiny-mtp", "sim-tiny-mtp-keyed", host="0.0.0.0", auth="key",
                               draft_n_max=2)
        res = edgekit("deploy", "--board", board.name, "--recipe", str(other), timeout=900)
        assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr[-2000:]
        assert "already holds an API key that this workstation does not have" in res.stderr
        assert len(res.stderr.strip().splitlines()) == 1, res.stderr
        assert status(board.name)["current"] == report["release"] and completion(port, new) == 200
    finally:
        os.replace(aside, key_path)


def test_a_network_address_without_a_key_is_refused_and_one_with_a_key_is_accepted(tmp_path: Path) -> None:
    from edgekit.config.recipes import load_recipe

    res = edgekit("recipes", "show", str(recipe_variant(tmp_path, "sim-tiny-mtp", "open", host="0.0.0.0")), timeout=900)
    assert res.returncode == 2 and "add runtime.auth: key" in res.stderr, res.stderr
    keyed = load_recipe(str(recipe_variant(tmp_path, "sim-tiny-mtp", "keyed", host="0.0.0.0", auth="key")))
    assert keyed.runtime.auth == "key" and keyed.runtime.host == "0.0.0.0"


def test_an_engine_whose_key_leaves_model_paths_open_is_refused_a_network_address() -> None:
    import pytest

    from edgekit.engines import get_engine
    from edgekit.errors import EdgekitError

    with pytest.raises(EdgekitError, match=r"vllm cannot serve on 0\.0\.0\.0 with a key"):
        get_engine("vllm").check_exposure("0.0.0.0", loopback=False)
    get_engine("vllm").check_exposure("127.0.0.1", loopback=True)  # a key on loopback guards /v1 from other users
    for name in ("llama.cpp", "litert-lm"):
        get_engine(name).check_exposure("0.0.0.0", loopback=False)
