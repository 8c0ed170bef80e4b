"""edgekit's llama.cpp patch series: each says what it does and its upstream status, applies to a copy of the pinned
tree (never the tree itself), and is part of the tree's identity, so of every build key.

That the patched binaries behave (a request's ``speculative.n_max``) is tested where they serve:
tests/test_convert_gguf.py (host build), tests/test_emulated_board.py (aarch64 build, emulated board).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from build_helpers import sdist_or_skip

from edgekit.build import patches
from edgekit.build import source as source_mod
from edgekit.build.plan import make_plan
from edgekit.build.source import resolve_source
from edgekit.build.targets import resolve_target
from edgekit.errors import EdgekitError

PATCH = """From: someone
Subject: [PATCH] doc : say hello

Because the file said nothing.

Upstream-Status: Pending (not yet proposed).
---
 a.txt | 1 +

diff --git a/a.txt b/a.txt
--- a/a.txt
+++ b/a.txt
@@ -1,2 +1,3 @@
 one
+hello
 two
"""


def test_every_patch_says_what_it_does_and_its_upstream_status() -> None:
    series = patches.series()
    assert series and len({p.name for p in series}) == len(series)
    for p in series:
        assert p.subject and p.upstream and p.touched, p
        assert "\n---\n" in p.text.decode() and p.text.decode().count("\ndiff --git ") == len(p.touched)


def _tree(root: Path, text: str = "one\ntwo\n") -> Path:
    (root / "sub").mkdir(parents=True)
    (root / "a.txt").write_text(text)
    (root / "sub" / "b.txt").write_text("kept\n")
    return root


def _series(tmp_path: Path) -> list[patches.Patch]:
    d = tmp_path / "series-dir"
    d.mkdir()
    (d / "0001-doc-say-hello.patch").write_text(PATCH)
    (d / "series").write_text("# comment\n0001-doc-say-hello.patch\n")
    return patches.series(d)


def test_a_patch_applies_to_a_copy_and_the_original_is_untouched(tmp_path: Path) -> None:
    series = _series(tmp_path)
    assert series[0].subject == "doc : say hello" and series[0].touched == ["a.txt"]
    original = _tree(tmp_path / "orig")
    copy = tmp_path / "copy"
    patches.link_tree(original, copy, {f for p in series for f in p.touched})
    assert patches.apply_series(copy, series, "the copy") == {"0001-doc-say-hello": "applied"}
    assert (copy / "a.txt").read_text() == "one\nhello\ntwo\n"
    assert (original / "a.txt").read_text() == "one\ntwo\n"  # a hard link would have changed it too
    assert (copy / "sub" / "b.txt").samefile(original / "sub" / "b.txt")  # the rest is linked, not copied
    # a tree that already has the change (upstream took it) is recorded as such, and left as it is
    assert patches.apply_series(copy, series, "the copy") == {"0001-doc-say-hello": "already in the tree"}
    assert (copy / "a.txt").read_text() == "one\nhello\ntwo\n"


def test_a_patch_that_does_not_apply_stops_with_its_name(tmp_path: Path) -> None:
    series = _series(tmp_path)
    other = _tree(tmp_path / "other", "something\nelse\nentirely\n")
    with pytest.raises(EdgekitError, match=r"patch 0001-doc-say-hello does not apply to a tree at another ref: "):
        patches.apply_series(other, series, "a tree at another ref")


def test_a_patch_without_its_upstream_status_is_refused(tmp_path: Path) -> None:
    d = tmp_path / "bad"
    d.mkdir()
    (d / "0001-x.patch").write_text(PATCH.replace("Upstream-Status: Pending (not yet proposed).\n", ""))
    (d / "series").write_text("0001-x.patch\n")
    with pytest.raises(EdgekitError, match=r"0001-x\.patch has no Subject or no Upstream-Status"):
        patches.series(d)


def test_the_pinned_tree_takes_the_series_and_the_build_key_says_so() -> None:
    source = resolve_source(sdist_or_skip())
    series = patches.series()
    assert source.patches == {p.name: "applied" for p in series}
    assert source.identity.endswith(f"+patches:{patches.series_id(series)}") and source.pinned
    unpatched = Path((source.path.parent / ".edgekit-source.json").read_text().split('"unpatched": "')[1]
                     .split('"')[0])
    for name in {f for p in series for f in p.touched}:
        assert (source.path / name).read_bytes() != (unpatched / name).read_bytes(), name
    # the same tree without the series is another build
    target = resolve_target("host", cpu_only=True)
    plain = dataclasses.replace(source, identity=source.identity.split("+patches:")[0], patches={})
    keys = [make_plan(target, s, s.path, None).key_inputs()["source"] for s in (source, plain)]
    assert keys[0] != keys[1]


def test_a_changed_series_keeps_the_trees_path_and_refreshes_what_either_series_touches(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EDGEKIT_CACHE", str(tmp_path / "cache"))
    tree = _tree(tmp_path / "llama")
    for part in ("ggml", "tools/server"):
        (tree / part).mkdir(parents=True)
    (tree / "CMakeLists.txt").write_text("")
    (tree / "ggml" / "CMakeLists.txt").write_text("")
    source = source_mod.Source(tree, "dir:test", None, "dir")
    first = _series(tmp_path)
    monkeypatch.setattr(source_mod, "series", lambda: first)
    one = source_mod.patched(source)
    assert one.patches == {"0001-doc-say-hello": "applied"} and (one.path / "a.txt").read_text() == "one\nhello\ntwo\n"
    built = (one.path / "a.txt").stat().st_mtime_ns  # an object built now is at least this young
    # the next series no longer patches a.txt: same path (the build dir reuses its objects), a.txt fresh again
    other = PATCH.split("diff --git")[0] + ("diff --git a/sub/b.txt b/sub/b.txt\n--- a/sub/b.txt\n+++ b/sub/b.txt\n"
                                            "@@ -1 +1,2 @@\n kept\n+more\n")
    second = [dataclasses.replace(first[0], name="0001-doc-other", text=other.encode())]
    monkeypatch.setattr(source_mod, "series", lambda: second)
    two = source_mod.patched(source)
    assert two.path == one.path and two.identity != one.identity
    assert (two.path / "a.txt").read_text() == "one\ntwo\n"
    assert (two.path / "sub" / "b.txt").read_text() == "kept\nmore\n"
    assert (two.path / "a.txt").stat().st_mtime_ns >= built  # ninja sees the change back and recompiles it
    assert not (two.path / "a.txt").samefile(tree / "a.txt")
    assert (tree / "sub" / "b.txt").read_text() == "kept\n"  # the tree itself is never changed
    assert source_mod.patched(source).identity == two.identity  # and it is made once
