"""release.json, typed: a manifest written by today's edgekit and one written before engines, GPU policy,
media and chat existed both load, with the defaults those versions meant, and give the same health spec."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from edgekit.deploy.activate import ActivationSpec
from edgekit.fleet.commands import Serve
from edgekit.release.manifest import ReleaseManifest, ServeSpec
from edgekit.release.plan import plan_release

TODAY = Path(__file__).parent / "data" / "releases" / "llama.cpp-2026-12-04.json"


def test_todays_release_json_loads_with_every_field() -> None:
    raw = json.loads(TODAY.read_text())
    m = ReleaseManifest.of(raw)
    assert m.release == raw["release"] and m.recipe == "sim-tiny-mtp" and m.engine == "llama.cpp"
    assert m.serve == ServeSpec(port=raw["port"], drafter=True, engine="llama.cpp", model="sim-tiny-mtp",
                                gpu="none", media=(), chat=True)
    assert m.candidate_port == raw["candidate_port"] and m.server_args == raw["server_args"]
    assert {rel: f.sha256 for rel, f in m.files.items()} == {rel: f["sha256"] for rel, f in raw["files"].items()}
    # What the engine added of its own is kept, and dumps back unchanged.
    assert m.model_dump(mode="json")["build"] == raw["build"] and m.model_dump(mode="json")["guards"] == raw["guards"]
    # The fleet's health arguments read it the same way.
    assert Serve.of_manifest(raw) == Serve(raw["port"], True, "llama.cpp", "sim-tiny-mtp", "none", True, "")


def test_an_older_release_json_loads_with_the_defaults_it_meant() -> None:
    raw = json.loads(TODAY.read_text())
    for newer in ("engine", "gpu", "media", "chat", "candidate_port", "guards", "sources"):
        raw.pop(newer)
    m = ReleaseManifest.of(raw)
    assert (m.engine, m.gpu, m.media, m.chat, m.candidate_port) == ("llama.cpp", "none", [], False, None)
    assert m.serve.port == raw["port"] and m.serve.drafter


def test_a_manifest_without_its_identity_is_refused() -> None:
    with pytest.raises(ValidationError):
        ReleaseManifest.of({"files": {}, "port": 8080})
    with pytest.raises(ValidationError):
        ReleaseManifest.of({"release": "r", "recipe": "x", "gpu": "sometimes"})


def test_a_plan_activates_from_its_typed_manifest(tmp_path: Path) -> None:
    blob = tmp_path / "llama-server"
    blob.write_bytes(b"\x7fELF" + b"\0" * 64)
    plan = plan_release("demo", {"bin/llama-server": blob},
                        {"engine": "llama.cpp", "port": 9000, "candidate_port": 9001, "drafter": False,
                         "gpu": "required", "media": ["image"], "chat": True})
    spec = ActivationSpec.of_plan(plan, keep=3, strategy="in-place", timeout=30)
    assert spec.release_id == plan.release_id and set(spec.file_shas) == {"bin/llama-server", "release.json"}
    assert spec.serve == ServeSpec(port=9000, engine="llama.cpp", model="demo", gpu="required", media=("image",),
                                   chat=True)
    assert spec.candidate_port == 9001 and spec.serve.on_port(9001).port == 9001


def test_the_fleets_health_arguments_default_as_the_manifest_does() -> None:
    """fleet.commands.Serve reads manifests without pydantic (it runs in every Ansible worker): same answers."""
    today = json.loads(TODAY.read_text())
    older = {k: v for k, v in today.items() if k not in ("engine", "gpu", "media", "chat", "candidate_port")}
    for raw in (today, older, {"release": "r", "recipe": "x"}, {**today, "media": ["image", "audio"]}):
        s = ReleaseManifest.of(raw).serve
        assert Serve.of_manifest(raw) == Serve(s.port, s.drafter, s.engine, s.model, s.gpu, s.chat, ",".join(s.media))


def test_a_missing_or_damaged_release_json_is_one_sentence() -> None:
    from edgekit.errors import EdgekitError

    with pytest.raises(EdgekitError, match=r"^The release.json of release r on board 'b' is missing or unreadable.$"):
        ReleaseManifest.read({}, "release r on board 'b'")
    with pytest.raises(EdgekitError, match=r"is damaged \(gpu: "):
        ReleaseManifest.read({"release": "r", "recipe": "x", "gpu": "sometimes"}, "release r on board 'b'")
