"""`runtime.spec: auto` on a simulated board (real sshd, real llama-server, the real A/B).

On the simulated boards the tiny drafter costs more than it saves (the target is as cheap as the drafter on a
CPU), so with the default bar (it must be faster) the target alone is served, and release.json says why with
the figures. A bar low enough (``spec_min_gain: 0.05``) lets the same drafter win: it is served.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml
from build_helpers import sdist_or_skip
from cli_helpers import edgekit, ok_json

from edgekit.bench.spec_auto import judge
from edgekit.bench.stats import estimate
from edgekit.config.recipes import Recipe
from edgekit.resources import builtin_recipes_dir
from edgekit.sim.testing import SimBoard


def _recipe(tmp: Path, name: str, **runtime: object) -> Path:
    data = yaml.safe_load((builtin_recipes_dir() / "sim-tiny-mtp.yaml").read_text())
    data["name"] = name
    data["runtime"].update({"spec": "auto", **runtime})
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.fixture(scope="module")
def env(sim_session) -> dict[str, str]:  # type: ignore[no-untyped-def]
    return {**os.environ, **sim_session.env, "EDGEKIT_LLAMA_SRC": str(sdist_or_skip())}


@pytest.fixture
def board(sim_session) -> SimBoard:  # type: ignore[no-untyped-def]
    (b,) = sim_session.boards(1, "orin", fresh=True)
    return b


def _current(board: SimBoard) -> dict:
    return json.loads((board.base / "current" / "release.json").read_text())


def test_where_the_drafter_loses_the_target_alone_is_served_and_says_why(board: SimBoard, env: dict[str, str],
                                                                        tmp_path: Path) -> None:
    recipe = _recipe(tmp_path, "sim-auto-loses")
    report = ok_json(edgekit("--json", "deploy", "--board", board.name, "--recipe", str(recipe), env=env))
    spec = report["spec_auto"]
    print(f"\nspec auto, drafter loses: {spec['reason']}; deploy {report['seconds']} s, A/B {spec['seconds']} s")
    assert spec["serve"] == "target alone" and spec["remeasured"]
    gain = spec["gain"]
    assert gain["mean"] - gain["ci95"] <= spec["min_gain"] and spec["pairs"] >= 3  # lost, or could not show a gain
    assert spec["drafter"]["acceptance"] > 0  # the drafter really drafted in the A/B
    manifest = _current(board)
    assert not manifest["drafter"] and manifest["spec_type"] == "none"
    assert "--spec-type" not in manifest["server_args"] and "-md" not in manifest["server_args"]
    decision = manifest["runtime"]["spec_decision"]
    assert decision["serve"] == "target alone" and decision["reason"] == spec["reason"]
    assert decision["measured_release"] != manifest["release"]  # the drafted release it was measured on
    assert report["health"]["ok"] and any("spec auto" in n for n in report["notes"])
    status = ok_json(edgekit("--json", "status", "--board", board.name, env=env))
    assert status["spec_decision"]["reason"] == spec["reason"] and status["health"]["ok"]

    # The same recipe again: decided for this drafted release already, nothing measured, nothing changed.
    again = ok_json(edgekit("--json", "deploy", "--board", board.name, "--recipe", str(recipe), env=env))
    assert not again["changed"] and again["release"] == manifest["release"]
    assert again["spec_auto"]["remeasured"] is False and again["spec_auto"]["serve"] == "target alone"


def test_where_the_drafter_wins_it_is_served(board: SimBoard, env: dict[str, str], tmp_path: Path) -> None:
    # Its clients sample at 0.7: the A/B is measured there.
    recipe = _recipe(tmp_path, "sim-auto-wins", spec_min_gain=0.05, client_temperature=0.7)
    report = ok_json(edgekit("--json", "deploy", "--board", board.name, "--recipe", str(recipe), env=env))
    spec = report["spec_auto"]
    print(f"\nspec auto, bar 0.05×: {spec['reason']}; deploy {report['seconds']} s, A/B {spec['seconds']} s")
    assert spec["serve"] == "drafter" and spec["gain"]["values"] and min(spec["gain"]["values"]) > 0.05
    assert spec["temperature"] == 0.7 and "temperature 0.7" in spec["reason"]
    manifest = _current(board)
    assert manifest["drafter"] and manifest["spec_type"] == "draft-mtp"
    assert manifest["runtime"]["spec_decision"] is None and manifest["release"] == report["release"]
    assert report["health"]["draft_n"] > 0
    again = ok_json(edgekit("--json", "deploy", "--board", board.name, "--recipe", str(recipe), env=env))
    assert not again["changed"] and again["spec_auto"]["remeasured"] is False


def test_tune_deploys_the_target_alone_where_no_drafted_setting_beats_it(board: SimBoard, env: dict[str, str],
                                                                         tmp_path: Path) -> None:
    recipe = _recipe(tmp_path, "sim-tune-alone", spec="on")
    ok_json(edgekit("--json", "deploy", "--board", board.name, "--recipe", str(recipe), env=env))
    # A bar no tiny drafter clears (3×): two quick repetitions can put draft length 1 a little ahead of its target.
    res = edgekit("tune", "--board", board.name, "--recipe", str(recipe), "--quick", "--draft-n", "1,3",
                  "--min-gain", "3", "--no-power", "--out", str(tmp_path / "tune"), env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "Best by tok/s: no drafter." in " ".join(res.stdout.split())
    result = json.loads((tmp_path / "tune" / "tune.json").read_text())
    print(f"\ntune: {result['message']}")
    assert not result["drafter"] and result["best"]["name"] == "baseline" and result["drafter_gain"] <= 3.0
    manifest = _current(board)
    assert manifest["release"] == result["deployed"]["release"] and not manifest["drafter"]
    assert manifest["runtime"]["spec_decision"]["by"] == "tune"
    assert manifest["runtime"]["spec_decision"]["reason"].startswith("the target alone is served: the best drafted")
    tuned = yaml.safe_load((tmp_path / "tune" / "sim-tune-alone.tuned.yaml").read_text())
    assert "drafter" not in tuned and tuned["runtime"]["spec"] == "off"


def test_judge_needs_the_interval_above_the_bar() -> None:
    assert judge(estimate([1.3, 1.4, 1.35]), 1.0, final=False) == "drafter"
    assert judge(estimate([0.7, 0.68, 0.71]), 1.0, final=False) == "target alone"
    assert judge(estimate([0.9, 1.2, 1.05]), 1.0, final=False) is None  # not clear yet: more pairs
    assert judge(estimate([0.9, 1.2, 1.05]), 1.0, final=True) == "target alone"  # a tie keeps the memory free
    assert judge(estimate([1.3]), 1.0, final=False) is None and judge(None, 1.0, final=True) == "target alone"


def test_spec_off_leaves_the_drafter_out_and_bad_bars_are_refused() -> None:
    data = yaml.safe_load((builtin_recipes_dir() / "sim-tiny-mtp.yaml").read_text())
    off = Recipe.model_validate({**data, "runtime": {**data["runtime"], "spec": "off"}})
    assert off.drafter is None and off.runtime.spec_type == "none"
    with pytest.raises(ValueError, match="spec_min_gain"):
        Recipe.model_validate({**data, "runtime": {**data["runtime"], "spec_min_gain": 0}})
    with pytest.raises(ValueError, match="spec"):
        Recipe.model_validate({**data, "runtime": {**data["runtime"], "spec": "maybe"}})
    for name in ("e2b-mtp", "e4b-mtp"):
        assert yaml.safe_load((builtin_recipes_dir() / f"{name}.yaml").read_text())["runtime"]["spec"] == "auto"
