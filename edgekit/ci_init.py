"""`edgekit ci init`: the nightly on-device benchmark workflow, written into the user's repository with the
edgekit install pinned — from a repository at a commit or a wheel, never a package name from a registry
("edgekit" on PyPI is somebody else's project: a runner that may run `jetson_clocks` must not install it)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from edgekit.errors import EdgekitError
from edgekit.resources import ci_dir

DIST = "edgekit-jetson"
SPEC_LINE = '  EDGEKIT_PIP_SPEC: ""\n'  # the template's placeholder, replaced by the pinned spec
WORKFLOW = Path(".github/workflows/nightly-bench.yml")
LINT_CONFIG = Path(".github/actionlint.yaml")
# name[extras] @ git+URL@REF where REF is a full commit or a version tag (a branch moves: not a pin)
_VCS_PINNED = re.compile(r"@\s*git\+\S+@([0-9a-f]{40}|v?\d+(\.\d+)*)$")


@dataclass(frozen=True)
class Written:
    files: list[str]
    spec: str


def installed_spec() -> str | None:
    """How this edgekit was installed, as a pinned requirement, when that is something a runner can fetch
    again: a VCS URL at its commit (PEP 610 direct_url.json). A local directory or wheel is not."""
    try:
        raw = metadata.distribution(DIST).read_text("direct_url.json")
    except metadata.PackageNotFoundError:
        return None
    if not raw:
        return None
    info = json.loads(raw)
    vcs, url = info.get("vcs_info") or {}, info.get("url", "")
    if vcs.get("vcs") == "git" and vcs.get("commit_id") and not url.startswith("file:"):
        return f"{DIST} @ git+{url}@{vcs['commit_id']}"
    return None


def check_spec(spec: str) -> str:
    """A pip requirement a runner can install without asking a registry for a name: a wheel (path or URL)
    or `edgekit-jetson @ git+URL@REF`."""
    spec = spec.strip()
    if not spec or "\n" in spec or '"' in spec:
        raise EdgekitError("The install spec must be one line without quotes, e.g. "
                           f"'{DIST} @ git+https://github.com/you/edgekit@<commit>' or a wheel URL.")
    if spec.endswith(".whl") and (spec.startswith(("https://", "/", "file:")) or " @ " in spec):
        return spec
    if _VCS_PINNED.search(spec) and spec.split("@", 1)[0].strip().split("[")[0] == DIST:
        return spec
    raise EdgekitError(f"{spec!r} is not pinned: give a wheel (an https:// URL or an absolute path on the runner) "
                       f"or '{DIST} @ git+URL@<commit or version tag>'; a branch moves, and a bare package name "
                       "could install somebody else's 'edgekit' from a registry.")


def write_workflow(repo: Path, spec: str | None, force: bool = False) -> Written:
    """Write the workflow and its actionlint config under REPO/.github; refuse to overwrite without force."""
    chosen = spec if spec is not None else installed_spec()
    if chosen is None:
        raise EdgekitError("This edgekit was not installed from a repository at a commit, so the workflow cannot "
                           "pin it by itself: pass --spec (a wheel URL, or "
                           f"'{DIST} @ git+https://…/edgekit@<commit>').")
    chosen = check_spec(chosen)
    if not repo.is_dir():
        raise EdgekitError(f"{repo} is not a directory.")
    targets = {WORKFLOW: _render(chosen), LINT_CONFIG: (ci_dir() / "actionlint.yaml").read_text()}
    existing = [str(repo / rel) for rel in targets if (repo / rel).exists()]
    if existing and not force:
        raise EdgekitError(f"{', '.join(existing)} already exist(s); pass --force to replace them.")
    for rel, text in targets.items():
        path = repo / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return Written([str(repo / rel) for rel in targets], chosen)


def _render(spec: str) -> str:
    template = (ci_dir() / "nightly-bench.yml").read_text()
    if template.count(SPEC_LINE) != 1:
        raise EdgekitError("edgekit's workflow template has no EDGEKIT_PIP_SPEC line: this install is broken.")
    return template.replace(SPEC_LINE, f"  EDGEKIT_PIP_SPEC: {json.dumps(spec)}\n")
