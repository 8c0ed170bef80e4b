"""`edgekit ci init`: the nightly on-device benchmark workflow, written into the user's repository with the
edgekit install pinned — from a repository at a commit or a wheel, never a package name from a registry
("edgekit" on PyPI is somebody else's project: a runner that may run `jetson_clocks` must not install it)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from urllib.parse import urlsplit

from edgekit.errors import EdgekitError
from edgekit.resources import ci_dir

DIST = "edgekit-jetson"
SPEC_LINE = '  EDGEKIT_PIP_SPEC: ""\n'  # the template's placeholder, replaced by the pinned spec
WORKFLOW = Path(".github/workflows/nightly-bench.yml")
LINT_CONFIG = Path(".github/actionlint.yaml")


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
    """A pip requirement a runner installs without asking a registry for a name: `edgekit-jetson @ git+URL@REV`
    (REV a full commit or a version tag) or a wheel of edgekit-jetson (an https:// or file: URL or an absolute
    path, optionally `#sha256=…`), either bare or as `edgekit-jetson[extras] @ <wheel>`."""
    spec = spec.strip()
    hint = (f"give '{DIST} @ git+https://…/edgekit@<commit or version tag>' or a wheel of {DIST} "
            "(an https:// URL or an absolute path on the runner)")
    if not spec or any(c.isspace() for c in spec.replace(" @ ", "", 1)) or '"' in spec:
        raise EdgekitError(f"{spec!r} is not one pip requirement: {hint}.")
    if " @ " in spec:
        name, url = spec.split(" @ ", 1)
        m = _NAME.fullmatch(name)
        if m is None or re.sub(r"[-_.]+", "-", m.group(1).lower()) != DIST:
            raise EdgekitError(f"{spec!r} names {name!r}, not {DIST}: {hint}.")
    else:
        url = spec
    problem = _vcs_problem(url) if url.startswith("git+") else _wheel_problem(url, named=" @ " in spec)
    if problem:
        raise EdgekitError(f"{spec!r} {problem}: {hint}; a branch moves, and a bare name could install "
                           "somebody else's 'edgekit' from a registry.")
    return spec


_NAME = re.compile(r"([A-Za-z0-9][A-Za-z0-9._-]*)(\[[A-Za-z0-9,_-]+\])?")
_REV = re.compile(r"[0-9a-f]{40}|v?\d+(\.\d+)*")
_WHEEL_HASH = re.compile(r"sha256=[0-9a-f]{64}")


def _vcs_problem(url: str) -> str | None:
    parts = urlsplit(url[len("git+"):])
    if parts.scheme not in ("https", "ssh"):
        return "is not a git+https or git+ssh URL"
    if parts.query:
        return "carries a query"
    keys = {kv.split("=", 1)[0] for kv in parts.fragment.split("&") if kv}
    if not keys <= {"egg", "subdirectory"}:
        return "carries a fragment pip does not read as egg= or subdirectory="
    path, at, rev = parts.path.rpartition("@")
    if not at or not path or not _REV.fullmatch(rev):
        return "is not pinned to a full commit or a version tag"
    return None


def _wheel_problem(url: str, named: bool) -> str | None:
    parts = urlsplit(url)
    if parts.scheme not in ("https", "file") and not (parts.scheme == "" and url.startswith("/")):
        return "is neither a git URL nor a wheel at an https://, file: or absolute path"
    if parts.query or (parts.fragment and not _WHEEL_HASH.fullmatch(parts.fragment)):
        return "carries a query or a fragment other than #sha256=<hex>"
    filename = parts.path.rsplit("/", 1)[-1]
    if not filename.endswith(".whl"):
        return "is not a wheel (.whl)"
    if not named and not filename.lower().startswith(DIST.replace("-", "_") + "-"):
        return f"is not a wheel of {DIST}"
    return None


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
