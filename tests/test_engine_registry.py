"""The engine registry: built-ins by name, and engines of one's own registered with one line
(``EDGEKIT_ENGINES``), loaded lazily and refused in one sentence when they cannot be."""

from __future__ import annotations

import re
import sys

import pytest

from edgekit.config.engine_table import ENGINE_CLASSES, engine_names
from edgekit.engines import EngineBase, find_engine, get_engine
from edgekit.errors import EdgekitError


def test_builtins_load_lazily_and_declare_their_capabilities() -> None:
    for name in ENGINE_CLASSES:
        engine = get_engine(name)
        assert isinstance(engine, EngineBase) and engine.health_api in ("llama", "openai")
    assert find_engine("no-such-engine") is None
    unknown = re.escape("Unknown engine 'nope'; edgekit serves with llama.cpp, vllm, litert-lm")
    with pytest.raises(EdgekitError, match=unknown):
        get_engine("nope")


def test_an_engine_of_ones_own_is_one_line_in_the_environment(tmp_path, monkeypatch) -> None:
    (tmp_path / "my_engine.py").write_text(
        "from edgekit.engines import EngineBase\n\n\nclass Mine(EngineBase):\n    health_api = 'llama'\n\n\n"
        "class NotAnEngine:\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("EDGEKIT_ENGINES", "mine=my_engine:Mine, stray=my_engine:NotAnEngine")
    assert engine_names()[-2:] == ("mine", "stray")
    assert type(get_engine("mine")).__name__ == "Mine"
    with pytest.raises(EdgekitError, match=re.escape("not built on edgekit.engines.EngineBase")):
        get_engine("stray")
    monkeypatch.setenv("EDGEKIT_ENGINES", "gone=no_such_module_here:Engine")
    with pytest.raises(EdgekitError, match="cannot be loaded"):
        get_engine("gone")
    sys.modules.pop("my_engine", None)


@pytest.mark.parametrize("entry,says", [
    ("mine", "is not name=package.module:Class"),
    ("Mine=my_engine:Mine", "is not name=package.module:Class"),
    ("mine=my engine:Mine", "is not name=package.module:Class"),
    ("mine=my_engine", "is not name=package.module:Class"),
    ("vllm=my_engine:Mine", "cannot replace the built-in engine 'vllm'"),
])
def test_a_bad_registration_is_one_sentence(monkeypatch, entry: str, says: str) -> None:
    monkeypatch.setenv("EDGEKIT_ENGINES", entry)
    with pytest.raises(EdgekitError, match=says):
        engine_names()


def test_a_recipe_may_name_a_registered_engine_only(tmp_path, monkeypatch) -> None:
    from edgekit.config.recipes import Runtime

    with pytest.raises(ValueError, match=re.escape("engine must be one of llama.cpp, vllm, litert-lm, not 'mine'")):
        Runtime(engine="mine")
    monkeypatch.setenv("EDGEKIT_ENGINES", "mine=my_engine:Mine")
    assert Runtime(engine="mine").engine == "mine"
