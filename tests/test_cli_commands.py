"""Every command in the table answers `--help`; a command that cannot be imported is an error, not a
command missing from the list; a demo that fails after starting a simulated board stops it again."""

from __future__ import annotations

import json
import os
from pathlib import Path

import psutil
import pytest
from cli_helpers import edgekit

from edgekit.cli import COMMANDS, CommandLoadError, load_command


def test_help_lists_every_command_of_the_table() -> None:
    res = edgekit("--help", env=dict(os.environ, COLUMNS="80"), timeout=120)
    assert res.returncode == 0, res.stderr
    rows = [line for line in res.stdout.split("Commands:", 1)[1].splitlines() if line.strip()]
    assert [row.split()[0] for row in rows] == list(COMMANDS)  # one line each: no wrapped text looks like a command
    listed = [line.split()[0] for line in res.stdout.split("Commands:", 1)[1].splitlines() if line.startswith("  ")
              and not line.startswith("    ")]
    assert listed == list(COMMANDS)


@pytest.mark.parametrize("name", list(COMMANDS))
def test_every_command_answers_help(name: str) -> None:
    res = edgekit(name, "--help", timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith(f"Usage: edgekit {name}") and "Traceback" not in res.stderr


def test_a_command_that_cannot_be_imported_is_a_loud_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(COMMANDS, "ghost", ("no_such_module", "ghost", "A command whose module is missing."))
    with pytest.raises(CommandLoadError, match="'ghost' could not be loaded"):
        load_command("ghost")


def _sim_processes(sim_dir: Path) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if any(str(sim_dir) in part for part in proc.info["cmdline"] or ()):
                found.append(proc)
        except psutil.Error:
            continue
    return found


def _isolated(tmp_path: Path, **extra: str) -> dict[str, str]:
    return dict(os.environ, EDGEKIT_SIM_DIR=str(tmp_path / "sim"), EDGEKIT_CONFIG_DIR=str(tmp_path / "config"),
                EDGEKIT_CONFIG=str(tmp_path / "config" / "edgekit.yaml"), **extra)


def _boards_up(env: dict[str, str], cwd: Path) -> list[dict]:
    res = edgekit("--json", "sim", "status", env=env, cwd=cwd, timeout=120)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)["boards"]


def test_a_demo_that_fails_stops_the_board_it_started(tmp_path: Path) -> None:
    # The board starts and is probed; the deploy then fails (no such llama.cpp source).
    env = _isolated(tmp_path, EDGEKIT_LLAMA_SRC=str(tmp_path / "no-such-source"))
    res = edgekit("demo", env=env, cwd=tmp_path, timeout=120)
    assert res.returncode == 2, res.stdout + res.stderr
    assert "2/3 probed" in res.stderr and "does not exist" in res.stderr and "Traceback" not in res.stderr
    assert "stopped the simulated board sim-1 it had started" in res.stderr
    assert _sim_processes(tmp_path / "sim") == []  # no sshd, no power updater left behind
    assert _boards_up(env, tmp_path) == []


def test_a_demo_of_an_unknown_recipe_starts_nothing(tmp_path: Path) -> None:
    env = _isolated(tmp_path)
    res = edgekit("demo", "--recipe", "no-such-recipe", env=env, cwd=tmp_path, timeout=120)
    assert res.returncode == 2 and "No recipe named 'no-such-recipe'" in res.stderr
    assert "1/3" not in res.stderr and _boards_up(env, tmp_path) == []
