"""Profiles, the board file and recipes: every bad input gives one clear line and exit 2."""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import pytest
from cli_helpers import edgekit

from edgekit.config.profiles import PROFILES, get_profile
from edgekit.config.recipe_lookup import list_recipes
from edgekit.engines.board_check import board_file
from edgekit.engines.recipe_check import load_recipe
from edgekit.errors import EdgekitError

REPO = Path(__file__).resolve().parents[1]


def test_profiles_carry_what_build_and_roofline_need() -> None:
    assert {"orin-agx-64gb", "orin-agx-32gb", "orin-nx-16gb", "orin-nx-8gb", "orin-nano-8gb",
            "thor-agx-128gb"} <= set(PROFILES)
    orin, thor = get_profile("orin"), get_profile("thor")
    assert orin.name == "orin-agx-64gb" and thor.name == "thor-agx-128gb"
    assert (orin.cuda_arch, orin.cpu_arch, orin.jetpack, orin.l4t_major, orin.cuda_version) == (
        87, "armv8.2-a+dotprod+fp16", "6", 36, "12.6")
    assert (thor.cuda_arch, thor.jetpack, thor.cuda_major) == (110, "7", 13)
    assert orin.total_power_rail == "VIN_SYS_5V0" and thor.total_power_rail == "VIN"
    assert get_profile("orin-nx-16gb").total_power_rail == "VDD_IN"
    for p in PROFILES.values():
        assert p.total_power_rail in {r.label for r in p.power_rails}
        assert p.mem_bandwidth_gbs > 0 and p.mem_gb > 0
    with pytest.raises(EdgekitError, match="Unknown board profile 'xavier'"):
        get_profile("xavier")


def test_shipped_recipes_validate() -> None:
    names = {r.name for r in list_recipes()}
    assert {"e2b-mtp", "e4b-mtp", "e2b", "sim-tiny-mtp", "sim-gemma3-270m"} <= names
    for name in names:
        load_recipe(name)
    mtp = load_recipe("e2b-mtp")
    assert mtp.drafter is not None and mtp.runtime.spec_type == "draft-mtp"
    assert load_recipe("e2b").drafter is None
    assert load_recipe("sim-gemma3-270m").target.package


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "localhost", "::1", "[::1]"])
def test_the_board_s_loopback_is_served_and_is_every_shipped_recipe_s(tmp_path: Path, host: str) -> None:
    assert load_recipe(str(write(tmp_path, "lo.yaml", GOOD + f"  host: '{host}'\n"))).runtime.host == host
    assert {load_recipe(r.name).runtime.host for r in list_recipes()} == {"127.0.0.1"}


def test_recipe_search_path_and_shadowing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An explicit path, then ./recipes, then the user's config dir, then the built-ins; the first wins and
    says what it shadows."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("EDGEKIT_RECIPES", raising=False)
    monkeypatch.setenv("EDGEKIT_CONFIG_DIR", str(tmp_path / "config"))
    builtin = load_recipe("e2b-mtp")
    assert builtin.origin == "built-in" and "edgekit/data/recipes" in builtin.source_file
    user_dir, cwd_dir = tmp_path / "config" / "recipes", tmp_path / "recipes"
    user_dir.mkdir(parents=True)
    cwd_dir.mkdir()
    text = Path(builtin.source_file).read_text()
    (user_dir / "e2b-mtp.yaml").write_text(text.replace("description:", "description: mine,", 1))
    assert load_recipe("e2b-mtp").origin == "the user's config dir (shadows the built-in e2b-mtp)"
    (cwd_dir / "e2b-mtp.yaml").write_text(text)
    found = load_recipe("e2b-mtp")
    assert found.origin == "./recipes (shadows the built-in e2b-mtp)" and found.source_file == str(
        (cwd_dir / "e2b-mtp.yaml").resolve())
    (user_dir / "only-mine.yaml").write_text(text.replace("name: e2b-mtp", "name: only-mine", 1))
    listed = {r.name: r for r in list_recipes()}
    assert listed["only-mine"].origin == "user" and not listed["only-mine"].shadows
    assert listed["e2b-mtp"].origin == "cwd" and len(listed["e2b-mtp"].shadows) == 2
    assert load_recipe(str(user_dir / "e2b-mtp.yaml")).origin == "the file named"
    res = edgekit("--json", "recipes", "show", "e2b-mtp", cwd=tmp_path,
                  env=dict(os.environ, EDGEKIT_CONFIG_DIR=str(tmp_path / "config")))
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["from"] == "./recipes (shadows the built-in e2b-mtp)"


def write(tmp: Path, name: str, text: str) -> Path:
    path = tmp / name
    path.write_text(textwrap.dedent(text))
    return path


GOOD = """\
name: good
target:
  synthetic: tiny-gemma4
drafter:
  synthetic: tiny-gemma4-assistant
runtime:
  spec_type: draft-mtp
  draft_n_max: 3
"""


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (GOOD.replace("  draft_n_max: 3", "  draft_n_max: [3"), r"line \d+: YAML syntax error"),
        (GOOD.replace("draft_n_max: 3", "draft_n_max: three"), r"line 8: field 'runtime.draft_n_max'"),
        (GOOD.replace("draft_n_max: 3", "draft_nmax: 3"), r"line 8: field 'runtime.draft_nmax': unknown field"),
        (GOOD.replace("name: good", "name: '$(rm -rf ~)'"), r"field 'name': recipe name .* is not a valid name"),
        (GOOD.replace("  synthetic: tiny-gemma4\n", "  repo: google/gemma-4-E2B-it\n", 1),
         "a repo needs a pinned revision"),
        (GOOD.replace("spec_type: draft-mtp", "spec_type: none"), "does not use one"),
        (GOOD.replace("drafter:\n  synthetic: tiny-gemma4-assistant\n", ""), "needs a drafter"),
        ("- just\n- a list\n", "must be a YAML mapping"),
        (GOOD + "  host: 0.0.0.0\n", r"line 9: field 'runtime.host': 0.0.0.0 would serve the model to every machine "
                                    r"that reaches the board, with no key: add runtime.auth: key .*, or serve on the "
                                    r"board's loopback"),
        (GOOD + "  host: 192.168.1.20\n", r"field 'runtime.host': 192.168.1.20 would serve the model"),
        (GOOD + "  host: orin-1.lab\n", r"field 'runtime.host': orin-1.lab would serve the model"),
    ],
)
def test_bad_recipes_name_file_line_and_field(tmp_path: Path, body: str, expected: str) -> None:
    path = write(tmp_path, "bad.yaml", body)
    with pytest.raises(EdgekitError, match=expected) as info:
        load_recipe(str(path))
    assert str(path) in str(info.value) or "mapping" in expected
    assert "\n" not in str(info.value)


def test_good_recipe_and_missing_recipe(tmp_path: Path) -> None:
    assert load_recipe(str(write(tmp_path, "good.yaml", GOOD))).runtime.draft_n_max == 3
    with pytest.raises(EdgekitError, match="does not exist"):
        load_recipe(str(tmp_path / "missing.yaml"))
    with pytest.raises(EdgekitError, match="not a valid name"):
        load_recipe("bad name$(id)")
    with pytest.raises(EdgekitError, match="must be a YAML mapping"):
        load_recipe("/etc/hostname")


@pytest.mark.parametrize(("written", "read"), [("off", "off"), ("on", "on"), ("'off'", "off"), ("auto", "auto")])
def test_mmproj_switch_reads_the_word_written_not_yaml_booleans(tmp_path: Path, written: str, read: str) -> None:
    # YAML 1.1 turns a bare off/on into false/true; the recipe means the word.
    body = GOOD + f"convert:\n  mmproj: {written}\n"
    assert load_recipe(str(write(tmp_path, "mm.yaml", body))).convert.mmproj == read
    with pytest.raises(EdgekitError, match=r"field 'convert\.mmproj'"):
        load_recipe(str(write(tmp_path, "mm-bad.yaml", GOOD + "convert:\n  mmproj: sometimes\n")))


BOARDS = """\
boards:
  orin-1:
    host: 10.0.0.5
    user: nvidia
    key: ~/.ssh/id_ed25519
    profile: orin
groups:
  canary: [orin-1]
"""


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (BOARDS.replace("profile: orin", "profile: xavier"), r"line 6: field 'boards.orin-1.profile'.*xavier"),
        (BOARDS.replace("host: 10.0.0.5", "host: '10.0.0.5; reboot'"), "is not a host name"),
        (BOARDS.replace("orin-1:\n", "'orin 1':\n", 1), "board name 'orin 1' is not a valid name"),
        (BOARDS.replace("key: ~/.ssh/id_ed25519", "base: ../../etc"), "must be an absolute path"),
        (BOARDS.replace("key: ~/.ssh/id_ed25519", "base: \"/srv/it's\""), "must not contain quotes"),
        (BOARDS.replace("[orin-1]", "[thor-9]"), "names board 'thor-9'"),
        (BOARDS.replace("    user: nvidia\n", ""), r"field 'boards.orin-1.user': Field required"),
        (BOARDS + "  bad: [\n", "YAML syntax error"),
        # an engine's own board settings are its section, checked by it
        (BOARDS.replace("profile: orin", "profile: orin\n    vllm_python: /opt/v/bin/python"),
         r"line 7: field 'boards\.orin-1\.vllm_python': a setting of engine vllm, which goes in its section: "
         r"boards\.orin-1\.vllm\.python\.$"),
        (BOARDS.replace("profile: orin", "profile: orin\n    litert: {python: 3}"),
         r"line 7: field 'boards\.orin-1\.litert\.python': Input should be a valid string\.$"),
        (BOARDS.replace("profile: orin", "profile: orin\n    vllm: {pyhton: /x}"),
         r"line 7: field 'boards\.orin-1\.vllm\.pyhton': unknown field\.$"),
        (BOARDS.replace("profile: orin", "profile: orin\n    tensorrt: {python: /x}"),
         r"field 'boards\.orin-1\.tensorrt': unknown field \(an engine's own board settings go in its section: "),
        (BOARDS.replace("profile: orin", "profile: orin\n    vllm: /x"), r"engine vllm's section, a mapping"),
    ],
)
def test_bad_board_files(tmp_path: Path, body: str, expected: str) -> None:
    boards = board_file(write(tmp_path, "edgekit.yaml", body))
    with pytest.raises(EdgekitError, match=expected):
        boards.load()


def test_board_file_resolves_and_round_trips(tmp_path: Path) -> None:
    from edgekit.engines import get_engine

    boards = board_file(write(tmp_path, "edgekit.yaml", BOARDS.replace(
        "profile: orin", "profile: orin\n    vllm: {python: /opt/vllm/bin/python}")))
    board = boards.get("orin-1")
    assert (board.port, board.base, board.profile) == (22, "~/edgekit", "orin")
    assert get_engine("vllm").board_settings(board).python == "/opt/vllm/bin/python"
    assert get_engine("litert-lm").board_settings(board).python is None
    boards.update(add={"orin-2": board})  # a section is written back as it was read
    assert boards.get("orin-2").section("vllm") == {"python": "/opt/vllm/bin/python"}
    with pytest.raises(EdgekitError, match=r"No board named .nope..*orin-1"):
        boards.get("nope")
    boards.update(remove=["orin-1", "orin-2"])
    assert boards.load().boards == {} and boards.load().groups == {"canary": []}


def test_cli_errors_are_one_line_exit_2(tmp_path: Path) -> None:
    bad = write(tmp_path, "edgekit.yaml", BOARDS.replace("profile: orin", "profile: [orin"))
    res = edgekit("--config", str(bad), "boards", "list")
    assert res.returncode == 2
    assert res.stderr.count("\n") == 1 and "Traceback" not in res.stderr
    assert "YAML syntax error" in res.stderr
    res = edgekit("--config", str(tmp_path / "absent.yaml"), "board", "probe", "--board", "ghost")
    assert res.returncode == 2 and "No board named 'ghost'" in res.stderr


def test_cli_version_and_json(tmp_path: Path) -> None:
    res = edgekit("--version")
    assert res.returncode == 0 and "edgekit, version" in res.stdout
    good = write(tmp_path, "edgekit.yaml", BOARDS)
    res = edgekit("--config", str(good), "boards", "list", "--json")
    import json

    assert json.loads(res.stdout)["boards"][0]["name"] == "orin-1"
