"""Values that reach the board are printable: a recipe or a board file holding a control
character is refused as it is loaded, in one sentence naming the field by its path, and nothing is sent."""

from __future__ import annotations

import os
import re
import subprocess
import textwrap
from pathlib import Path

import pytest
from cli_helpers import edgekit
from test_config import BOARDS

from edgekit.config.boardfile import Board, BoardFile, Boards
from edgekit.config.printable import UnprintableValue, shown
from edgekit.config.recipe_lookup import list_recipes
from edgekit.config.recipes import Recipe, Runtime, load_recipe
from edgekit.errors import EdgekitError
from edgekit.resources import builtin_recipes_dir

TAIL = "values that reach the board must be printable."

RECIPE = """\
name: good
target:
  synthetic: tiny-gemma4
drafter:
  synthetic: tiny-gemma4-assistant
runtime:
  spec_type: draft-mtp
  env:
    GGML_X: "1"
  extra_args: ["--verbose", "--no-warmup"]
"""



def write(tmp: Path, name: str, text: str) -> Path:
    path = tmp / name
    path.write_text(textwrap.dedent(text))
    return path


def cli(tmp: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "EDGEKIT_CONFIG_DIR": str(tmp / "config"), "EDGEKIT_CONFIG": "", "EDGEKIT_RECIPES": ""}
    return edgekit(*args, env=env, cwd=tmp, timeout=120)


def said(field: str, code: int) -> str:
    return f"{field} holds a control character (U+{code:04X}); {TAIL}"


def sentence(where: str, field: str, code: int) -> str:
    return f"{where}: {said(field, code)}"


# (what to change in RECIPE, the field's path as the sentence names it, the character's code point)
BAD_RECIPES = [
    ('GGML_X: "1"', 'GGML_X: "1\\n[Service]\\nExecStartPre=/bin/sh -c id"', "runtime.env.GGML_X", 0x0A),
    ('"--no-warmup"', '"--no-warmup\\r"', "runtime.extra_args[1]", 0x0D),
    ('"--verbose"', '"--verbose\\0"', "runtime.extra_args[0]", 0x00),
    ('GGML_X: "1"', '"GGML\\u2028X": "1"', "runtime.env.GGML\\u2028X", 0x2028),  # in the name
    ('GGML_X: "1"', 'GGML_X: "1\\u2029"', "runtime.env.GGML_X", 0x2029),
    ('GGML_X: "1"', '"GGML\\nX": "1"', "runtime.env.GGML\\nX", 0x0A),  # before the name's own check
    ('GGML_X: "1"', 'GGML_X: "a\\tb"', "runtime.env.GGML_X", 0x09),
    ('"--verbose"', '"--verbose\\x0b"', "runtime.extra_args[0]", 0x0B),
    ('"--verbose"', '"--verbose\\x0c"', "runtime.extra_args[0]", 0x0C),
    ('"--verbose"', '"\\x1c"', "runtime.extra_args[0]", 0x1C),
    ('"--verbose"', '"--verbose\\N"', "runtime.extra_args[0]", 0x85),  # YAML's \N: U+0085
    ('["--verbose", "--no-warmup"]', "[!!binary Cg==]", "runtime.extra_args[0]", 0x0A),  # bytes become text
    ("  spec_type: draft-mtp\n", '  spec_type: draft-mtp\n  vllm: {extra_args: ["--x", "\\ny"]}\n',
     "runtime.vllm.extra_args[1]", 0x0A),
    ("  spec_type: draft-mtp\n", '  spec_type: draft-mtp\n  vllm: {image: "repo\\n:tag"}\n',
     "runtime.vllm.image", 0x0A),
    ("  spec_type: draft-mtp\n", '  spec_type: draft-mtp\n  host: "127.0.0.1\\n"\n', "runtime.host", 0x0A),
    ("  spec_type: draft-mtp\n", '  spec_type: draft-mtp\n  llama_cpp: {allow_quirks: ["a\\rb"]}\n',
     "runtime.llama_cpp.allow_quirks[0]", 0x0D),
    ("  spec_type: draft-mtp\n", '  spec_type: draft-mtp\n  engine: "llama.cpp\\0"\n', "runtime.engine", 0x00),
    ("name: good", 'name: "good\\n"', "name", 0x0A),
    ("  synthetic: tiny-gemma4\n", '  path: "/models/\\x1e"\n', "target.path", 0x1E),
    ("  synthetic: tiny-gemma4-assistant\n", '  synthetic: tiny-gemma4-assistant\n  align: {data: "p\\n.txt"}\n',
     "drafter.align.data", 0x0A),
    ("name: good\n", 'name: good\nbench: {prompt_set: "x\\u2028"}\n', "bench.prompt_set", 0x2028),
]


@pytest.mark.parametrize(("old", "new", "field", "code"), BAD_RECIPES)
def test_a_recipe_with_a_control_character_is_refused_naming_the_field(
        tmp_path: Path, old: str, new: str, field: str, code: int) -> None:
    assert RECIPE.count(old) >= 1
    path = write(tmp_path, "bad.yaml", RECIPE.replace(old, new, 1))
    with pytest.raises(EdgekitError) as info:
        load_recipe(str(path))
    assert str(info.value) == sentence(f"recipe {path}", field, code)
    assert str(info.value).isprintable()  # one line, the character itself shown escaped


def test_the_same_check_holds_for_a_model_made_in_code() -> None:
    base = {"name": "x", "target": {"synthetic": "tiny-gemma4"}}
    with pytest.raises(UnprintableValue, match=re.escape(said("runtime.extra_args[1]", 0x0A))):
        Recipe.model_validate({**base, "runtime": {"extra_args": ["-v", "a\nb"]}})
    with pytest.raises(UnprintableValue, match=re.escape(said("env.A", 0x0A))):
        Runtime(env={"A": "\n"})
    with pytest.raises(UnprintableValue, match=re.escape(said("host", 0x09))):
        Board(host="a\tb", user="u", profile="orin")
    with pytest.raises(UnprintableValue, match=re.escape(said("boards.b.base", 0x0C))):
        BoardFile.model_validate({"boards": {"b": {"host": "h", "user": "u", "profile": "orin", "base": "/\x0c"}}})


def test_free_text_and_what_edgekit_writes_itself_may_span_lines(tmp_path: Path) -> None:
    body = RECIPE.replace("name: good\n", "name: good\ndescription: |\n  two\n  \tlines\n")
    assert load_recipe(str(write(tmp_path, "ok.yaml", body))).description == "two\n\tlines\n"
    decided = Recipe.model_validate({"name": "x", "target": {"synthetic": "tiny-gemma4"},
                                     "runtime": {"spec_decision": {"reason": "slower\nby 3%"}}})
    assert decided.runtime.spec_decision == {"reason": "slower\nby 3%"}


def test_every_built_in_recipe_still_loads(tmp_path: Path) -> None:
    files = sorted(builtin_recipes_dir().glob("*.yaml"))
    assert len(files) >= 5
    for path in files:
        assert load_recipe(str(path)).name == path.stem
    assert {r.name for r in list_recipes()} >= {p.stem for p in files}
    res = cli(tmp_path, "recipes", "list")
    assert res.returncode == 0, res.stderr
    assert all(p.stem in res.stdout for p in files)


# (what to change in BOARDS, the field's path, the character's code point)
BAD_BOARDS = [
    ("host: 10.0.0.5", 'host: "10.0.0.5\\t"', "boards.orin-1.host", 0x09),
    ("user: nvidia", 'user: "nvidia\\n"', "boards.orin-1.user", 0x0A),
    ("key: ~/.ssh/id_ed25519", 'key: "~/.ssh/id\\0"', "boards.orin-1.key", 0x00),
    ("key: ~/.ssh/id_ed25519", 'base: "~/edgekit\\x0b"', "boards.orin-1.base", 0x0B),
    ("key: ~/.ssh/id_ed25519", 'known_hosts: "/k\\r"', "boards.orin-1.known_hosts", 0x0D),
    ("key: ~/.ssh/id_ed25519", 'vllm: {python: "/opt/v/bin/python\\nx"}', "boards.orin-1.vllm.python", 0x0A),
    ("key: ~/.ssh/id_ed25519", 'litert: {python: "\\u2028"}', "boards.orin-1.litert.python", 0x2028),
    ("key: ~/.ssh/id_ed25519", 'site_host: "10.0.0.9\\x1d"', "boards.orin-1.site_host", 0x1D),
    ("  orin-1:\n", '  "orin\\n1":\n', "boards.orin\\n1", 0x0A),
    ("  canary: [orin-1]", '  "can\\u2029ary": [orin-1]', "groups.can\\u2029ary", 0x2029),
    ("[orin-1]", '[orin-1, "x\\N"]', "groups.canary[1]", 0x85),
]


@pytest.mark.parametrize(("old", "new", "field", "code"), BAD_BOARDS)
def test_a_board_file_with_a_control_character_is_refused_naming_the_field(
        tmp_path: Path, old: str, new: str, field: str, code: int) -> None:
    assert old in BOARDS
    path = write(tmp_path, "edgekit.yaml", BOARDS.replace(old, new, 1))
    with pytest.raises(EdgekitError) as info:
        Boards(path).load()
    assert str(info.value) == sentence(f"board file {path}", field, code)
    assert str(info.value).isprintable()


def test_the_cli_exits_2_with_the_sentence_and_sends_nothing(tmp_path: Path) -> None:
    write(tmp_path, "bad.yaml", RECIPE.replace('"--no-warmup"', '"--no-warmup\\nExecStartPre=/bin/sh"'))
    res = cli(tmp_path, "recipes", "show", "./bad.yaml")
    assert res.returncode == 2 and res.stdout == ""
    assert res.stderr == "edgekit: " + sentence("recipe bad.yaml", "runtime.extra_args[1]", 0x0A) + "\n"

    write(tmp_path, "bad-boards.yaml", BOARDS.replace("host: 10.0.0.5", 'host: "10.0.0.5\\t"'))
    res = cli(tmp_path, "--config", "bad-boards.yaml", "boards", "list")
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert res.stderr == "edgekit: " + sentence("board file bad-boards.yaml", "boards.orin-1.host", 0x09) + "\n"

    # A deploy stops at the recipe, before it connects anywhere (the board's address is unroutable).
    write(tmp_path, "edgekit.yaml", BOARDS.replace("10.0.0.5", "192.0.2.1"))
    res = cli(tmp_path, "--config", "edgekit.yaml", "deploy", "--board", "orin-1", "--recipe", "./bad.yaml")
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and "runtime.extra_args[1] holds" in res.stderr


@pytest.mark.parametrize(("written", "read"), [(None, "default"), ("strict", "strict"), ("off", "off"),
                                               ("'off'", "off"), ("default", "default")])
def test_hardening_is_a_runtime_setting(tmp_path: Path, written: str | None, read: str) -> None:
    body = RECIPE + (f"  hardening: {written}\n" if written else "")
    assert load_recipe(str(write(tmp_path, "h.yaml", body))).runtime.hardening == read


def test_hardening_takes_only_its_words(tmp_path: Path) -> None:
    with pytest.raises(EdgekitError, match=r"field 'runtime.hardening'"):
        load_recipe(str(write(tmp_path, "h.yaml", RECIPE + "  hardening: paranoid\n")))


def test_shown_escapes_what_is_not_printable() -> None:
    assert shown("a\nb\u2028c\0") == "a\\nb\\u2028c\\x00"
    assert shown("GGML_X") == "GGML_X"
