"""The repository stands alone: no file git tracks names a path outside it, the notes or work items it grew from,
or the project's own issue numbers. A fact belongs where it is used, with its public source (an upstream
project's issue such as ``llama.cpp#24457`` is one); a measurement says what was measured and how.

Flagged, per line of every tracked text file (binary files and tests/data/ are skipped), as ``OUTSIDE`` and
``ISSUE`` below spell it: a relative path up into a shared folder beside the checkout or into its reference
copies, the notes file and the upper-case architecture map kept there (the repository's own map is
docs/architecture.md), an absolute path of the work machines, a work item by its number, and "issue N" on a
line that names no other project (an upstream name, ``name#N``, ``owner/repo #N`` or a URL). Each pattern
is written so that this file passes its own check.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SKIP_DIRS = ("tests/data/",)

# (pattern, what it is). Character classes such as [-] keep each pattern from matching its own source text.
OUTSIDE = [
    (re.compile(r"\.\.[/]shared\b"), "a path outside the repository"),
    (re.compile(r"\bshared[/]reference\b"), "a path outside the repository"),
    (re.compile(r"\bFIELD[-_]NOTES\b", re.IGNORECASE), "a notes file outside the repository"),
    (re.compile(r"\bARCHITECTURE[.]md\b"), "a map outside the repository (the repository's is docs/architecture.md)"),
    (re.compile(r"(?<![\w.~/-])[/]work[/]"), "an absolute path of a work machine"),
    (re.compile(r"\bseeds?[\s_-]*0\d\d\b", re.IGNORECASE), "a work item of the project by number"),
]
ISSUE = re.compile(r"\bissues?\s+#?\d+\b", re.IGNORECASE)
# A line that names another project makes "issue N" that project's: its name, `name#N`, `owner/repo` or a URL.
UPSTREAM = re.compile(
    r"llama[.-]?cpp|\bggml\b|vllm|jetson[-_]stats|jetson[-_]containers|jetson-ai-lab|litert|ollama|transformers"
    r"|paramiko|fabric|ansible|bitsandbytes|cpython|pytorch|tensorrt|openssh|systemd|actionlint|nginx|aria2"
    r"|[\w.-]+#\d+|\b[\w.-]+/[\w.-]+\s+(?:issues?\s+)?#?\d+|https?://",
    re.IGNORECASE)


def line_problems(line: str) -> list[str]:
    found = [what for pattern, what in OUTSIDE if pattern.search(line)]
    if ISSUE.search(line) and not UPSTREAM.search(line):
        found.append("the project's own issue by number")
    return found


def file_problems(path: Path, name: str) -> list[str]:
    """``name:line: what: the line`` for every reference outside the repository in a text file; [] for a binary."""
    try:
        data = path.read_bytes()
    except OSError:  # tracked but deleted in the work tree, or a dangling link
        return []
    if b"\0" in data[:8192]:
        return []
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return []
    return [f"{name}:{i}: {what}: {line.strip()[:160]}"
            for i, line in enumerate(text.split("\n"), 1) for what in line_problems(line)]  # an editor's line numbers


def tracked_files() -> list[str]:
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: nothing to list")
    return [n for n in out.decode("utf-8", "surrogateescape").split("\0") if n and not n.startswith(SKIP_DIRS)]


def test_no_tracked_file_refers_outside_the_repository() -> None:
    names = tracked_files()
    assert "README.md" in names and "docs/architecture.md" in names
    problems = [p for name in names for p in file_problems(REPO / name, name)]
    assert not problems, "\n".join(problems)


def test_this_file_passes_its_own_check() -> None:
    assert file_problems(Path(__file__), "tests/test_docs_standalone.py") == []


def test_the_check_flags_each_kind_and_names_file_and_line(tmp_path: Path) -> None:
    outside = "FIELD" + "-NOTES"
    bad = ["The original map is ../" + "shared/ARCH" + "ITECTURE.md.",
           "Copies of `shared/" + "reference/gemma4-configs/*.json`.",
           f"Measured on loopback ({outside}).",
           "See /" + "work/shared/notes.md.",
           "Seed" + " 004: the gain shrinks with concurrency.",
           "as issue" + " #35 asks", "(see issue" + " 15)"]
    good = ["Upstream: llama.cpp issue #24457, flash attention on Orin.",
            "jetson_stats issue #624 describes the rail.", "bitsandbytes issues #1939/#1941",
            "rbonghi/jetson_stats#344 says VIN_SYS_5V0 is the 5 V rail.",
            "The repository's map is docs/architecture.md ([architecture.md](architecture.md)).",
            "Defaults: 300 steps, seed 0, the site's seed board.",
            "python benchmarks/torture.py --seed 7", "color = '#555555'"]
    doc = tmp_path / "doc.md"
    doc.write_text("\n".join(["# A page", *bad, *good]) + "\n", encoding="utf-8")
    problems = file_problems(doc, "doc.md")
    lines = [int(p.split(":")[1]) for p in problems]
    assert sorted(set(lines)) == list(range(2, 2 + len(bad))), problems
    assert lines.count(2) == 2, problems  # the path up and the upper-case map on the same line
    assert problems[0].startswith("doc.md:2: a path outside the repository")
    (tmp_path / "blob.bin").write_bytes(b"\0" + outside.encode())
    assert file_problems(tmp_path / "blob.bin", "blob.bin") == []
