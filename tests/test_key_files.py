"""API key files (runtime.auth: key): a server never starts on an empty, short, missing or unprintable key file
(the agent's `exec` for llama-server and vLLM, the LiteRT-LM front), and the workstation neither keeps nor places
such a key (edgekit.config.api_keys, edgekit.remote.board_key)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from test_agent_support import AGENT, AGENT_DIR

from edgekit.agent.keyfile import MIN_KEY_CHARS, KeyFileError, read_key
from edgekit.config import api_keys
from edgekit.errors import EdgekitError
from edgekit.remote import board_key
from edgekit.remote.runner import LocalRunner

GOOD_KEY = api_keys.new_key()
BAD_FILES = {
    "empty": ("", "is empty"),
    "blank": ("  \n\n", "is empty"),
    "short": ("k" * (MIN_KEY_CHARS - 1) + "\n", f"is {MIN_KEY_CHARS - 1} characters long, shorter than the 32"),
    "control": ("a" * 20 + "\x01" + "b" * 20 + "\n", "non-printable"),
    "space": ("a" * 20 + " " + "b" * 20 + "\n", "non-printable"),
    "non-ascii": ("a" * 20 + "é" + "b" * 20 + "\n", "non-printable"),
    "huge": ("a" * 5000, "longer than 4096 bytes"),
}


def key_file(tmp_path: Path, case: str) -> Path:
    path = tmp_path / f"{case}.key"
    if case != "missing":
        path.write_text(BAD_FILES[case][0] if case in BAD_FILES else f"{GOOD_KEY}\n")
    return path


@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_read_key_refuses_a_file_that_holds_no_key_in_one_sentence(tmp_path: Path, case: str) -> None:
    path = key_file(tmp_path, case)
    with pytest.raises(KeyFileError) as err:
        read_key(str(path))
    text = str(err.value)
    assert BAD_FILES[case][1] in text and str(path) in text
    assert text.endswith(".") and text.replace(str(path), "").count(".") == 1  # one sentence
    assert "\n" not in text and "aaaa" not in text  # the key itself is never said


def test_read_key_refuses_a_missing_or_unreadable_file_and_takes_a_good_one(tmp_path: Path) -> None:
    with pytest.raises(KeyFileError, match=r"cannot read the API key file .*missing\.key: No such file"):
        read_key(str(key_file(tmp_path, "missing")))
    with pytest.raises(KeyFileError, match="cannot read the API key file"):
        read_key(str(tmp_path))  # a directory
    assert read_key(str(key_file(tmp_path, "good"))) == GOOD_KEY
    assert len(GOOD_KEY) >= MIN_KEY_CHARS  # the keys edgekit makes pass (43 characters)


def run_exec(tmp_path: Path, key: Path | None) -> tuple[subprocess.CompletedProcess, Path, Path]:
    """`exec` as a unit runs it, with a program that would leave a marker file."""
    log, marker = tmp_path / "server.log", tmp_path / "ran"
    log.write_text("earlier\n")
    argv = [sys.executable, "-B", str(AGENT), "exec", "--log", str(log),
            *(["--key-file", str(key)] if key is not None else []), "--", "sh", "-c", f"echo ran > {marker}"]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False), log, marker


@pytest.mark.parametrize("case", ["empty", "short", "missing", "control"])
def test_exec_refuses_to_start_a_server_on_a_bad_key_file(tmp_path: Path, case: str) -> None:
    path = key_file(tmp_path, case)
    res, log, marker = run_exec(tmp_path, path)
    assert res.returncode == 78, (res.stdout, res.stderr)
    assert not marker.exists()  # the program never ran
    lines = log.read_text().splitlines()
    assert lines[0] == "earlier" and len(lines) == 2, lines
    assert lines[1].startswith("exec: refusing to start: ") and str(path) in lines[1]
    with pytest.raises(KeyFileError) as err:
        read_key(str(path))
    assert lines[1] == f"exec: refusing to start: {err.value}"


def test_exec_starts_the_server_on_a_good_key_file_and_without_one(tmp_path: Path) -> None:
    res, log, marker = run_exec(tmp_path, key_file(tmp_path, "good"))
    assert res.returncode == 0 and marker.read_text() == "ran\n" and log.read_text() == "earlier\n"
    marker.unlink()
    res, _log, marker = run_exec(tmp_path, None)  # no --key-file: as before (runtime.auth off)
    assert res.returncode == 0 and marker.is_file()


@pytest.mark.parametrize("case", ["empty", "short", "missing"])
def test_the_litert_front_refuses_a_bad_key_file_before_it_loads_or_listens(tmp_path: Path, case: str) -> None:
    # Run as the board runs it: a script in the release's agent/ (litert_lm is imported only after the key).
    path = key_file(tmp_path, case)
    res = subprocess.run([sys.executable, "-B", str(AGENT_DIR / "litert_server.py"), "--model", "m.litertlm",
                          "--port", "1", "--api-key-file", str(path)],
                         capture_output=True, text=True, timeout=60, check=False)
    assert res.returncode == 78 and res.stdout == "", (res.stdout, res.stderr)
    assert res.stderr.startswith("edgekit litert-lm front: refusing to start: ") and str(path) in res.stderr
    assert res.stderr.count("\n") == 1 and "Traceback" not in res.stderr


def test_the_litert_front_reads_a_good_key(tmp_path: Path) -> None:
    from edgekit.agent import litert_server

    assert litert_server.read_api_key(str(key_file(tmp_path, "good"))) == GOOD_KEY
    with pytest.raises(SystemExit) as err:
        litert_server.read_api_key(str(key_file(tmp_path, "empty")))
    assert err.value.code == 78


@pytest.fixture
def config_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("EDGEKIT_CONFIG_DIR", str(tmp_path / "config"))
    return tmp_path / "config"


@pytest.mark.parametrize("key", ["k" * (MIN_KEY_CHARS - 1), "", "a" * 20 + "\n" + "b" * 20, "a" * 20 + " " + "b" * 20])
def test_the_workstation_neither_saves_nor_places_a_bad_key(tmp_path: Path, config_dir: Path, key: str) -> None:
    with pytest.raises(EdgekitError, match="Refusing to save this API key for board 'robot'"):
        api_keys.save_key("robot", key)
    assert not api_keys.key_file("robot").exists()
    base = tmp_path / "board"
    with pytest.raises(EdgekitError, match="Refusing to place this API key on the board") as err:
        board_key.place(LocalRunner("robot"), str(base), key)
    assert not base.exists()  # nothing written, not even the keys directory
    assert key.strip() == "" or key not in str(err.value)


def test_the_workstation_keeps_and_places_a_good_key_and_refuses_a_short_one_it_finds(
        tmp_path: Path, config_dir: Path) -> None:
    api_keys.save_key("robot", GOOD_KEY)
    assert api_keys.read_key("robot") == GOOD_KEY
    base = tmp_path / "board"
    board_key.place(LocalRunner("robot"), str(base), GOOD_KEY)
    assert read_key(board_key.key_file(str(base))) == GOOD_KEY
    api_keys.key_file("robot").write_text("short-key\n")  # left by hand, or by an older edgekit
    with pytest.raises(EdgekitError, match=r"is 9 characters long.*edgekit board key rotate --board robot"):
        api_keys.read_key("robot")


@pytest.mark.parametrize("raw", [b"k" * (MIN_KEY_CHARS - 1), b"", b"a" * 20 + b" " + b"b" * 20, "é".encode() * 40,
                                 b"x" * 5000])
def test_the_agent_refuses_a_bad_key_on_its_stdin_and_writes_nothing(tmp_path: Path, agent_pyz: Path,
                                                                     raw: bytes) -> None:
    import subprocess
    import sys

    base = tmp_path / "board"
    res = subprocess.run([sys.executable, str(agent_pyz), "key-place", str(base)], input=raw, capture_output=True,
                         check=False, timeout=60)
    assert res.returncode == 2 and b"refusing this API key" in res.stderr, res.stderr
    assert not (base / "keys").exists()
    assert len(raw) < 8 or raw[:8] not in res.stderr + res.stdout  # no part of it said back
    good = subprocess.run([sys.executable, str(agent_pyz), "key-place", str(base), "--env", "SERVER_KEY"],
                          input=GOOD_KEY.encode() + b"\n", capture_output=True, check=False, timeout=60)
    assert good.returncode == 0, good.stderr
    assert (base / "keys" / "api.key").read_text() == f"{GOOD_KEY}\n"
    assert (base / "keys" / "SERVER_KEY.env").read_text() == f"SERVER_KEY={GOOD_KEY}\n"
    assert {oct(p.stat().st_mode & 0o777) for p in (base / "keys").iterdir()} == {"0o600"}
    assert oct((base / "keys").stat().st_mode & 0o777) == "0o700"


def test_a_new_key_rewrites_every_environment_file_a_release_reads(tmp_path: Path, agent_pyz: Path) -> None:
    """An engine names the variable its server reads the key from; an environment file written before (an older
    release's ``api.env``, another engine's) gets the new key under its own names: none keeps the old one."""
    import subprocess
    import sys

    keys = tmp_path / "board" / "keys"
    keys.mkdir(parents=True, mode=0o700)
    (keys / "api.env").write_text("# the key\nVLLM_API_KEY='old-key-old-key-old-key-old-key-old-key'\n")

    def place(*env: str, key: str = GOOD_KEY) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run([sys.executable, str(agent_pyz), "key-place", str(tmp_path / "board"),
                               *[a for n in env for a in ("--env", n)]], input=key.encode(), capture_output=True,
                              check=False, timeout=60)

    assert place("LLAMA_API_KEY").returncode == 0
    assert (keys / "api.env").read_text() == f"VLLM_API_KEY={GOOD_KEY}\n"
    assert (keys / "LLAMA_API_KEY.env").read_text() == f"LLAMA_API_KEY={GOOD_KEY}\n"
    other = GOOD_KEY[::-1]
    assert place(key=other).returncode == 0  # a rotation names no variable: every file there follows
    assert {p.name: p.read_text() for p in keys.iterdir()} == {
        "api.key": f"{other}\n", "api.env": f"VLLM_API_KEY={other}\n", "LLAMA_API_KEY.env": f"LLAMA_API_KEY={other}\n"}
    bad = place("NOT A NAME", key=GOOD_KEY)
    assert bad.returncode == 2 and b"no environment variable's name" in bad.stderr, bad.stderr
    assert (keys / "api.key").read_text() == f"{other}\n"  # refused before anything was written
