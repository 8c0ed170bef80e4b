"""The one table of JetPack lines (config/jetpack.py) and the modules that read it agree."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from edgekit.build.targets import profile_target, resolve_target
from edgekit.config import jetpack
from edgekit.config.jetpack import DEFAULT_LINES, JETPACK_LINES, board_lines, line_for_l4t, line_for_version
from edgekit.config.profiles import PROFILES, with_jetpack
from edgekit.engines.vllm.container import IMAGES, default_image
from edgekit.errors import EdgekitError
from edgekit.remote.probe import jetpack_for, parse_l4t


def test_every_profile_runs_a_line_of_the_table():
    for profile in PROFILES.values():
        line = JETPACK_LINES[profile.jetpack]
        assert profile.jetpack == DEFAULT_LINES[profile.family]
        assert profile.family in line.families
        assert (profile.l4t_major, profile.l4t_release, profile.cuda_version) == (
            line.l4t_major, line.l4t_release, line.cuda_version)
    assert set(DEFAULT_LINES) == {p.family for p in PROFILES.values()}


def test_l4t_majors_are_unique_and_name_their_line():
    majors = [line.l4t_major for line in JETPACK_LINES.values()]
    assert len(majors) == len(set(majors))
    for key, line in JETPACK_LINES.items():
        assert key == line.jetpack
        assert line_for_l4t(line.l4t_major) is line and line_for_l4t(str(line.l4t_major)) is line
        for release, version in line.releases:
            assert release.split(".")[0] == str(line.l4t_major)
            assert line_for_version(version) is line, (release, version)


def test_board_lines_are_complete():
    assert set(board_lines()) == {"6", "7", "7.2"}
    for line in board_lines().values():
        assert line.l4t_release and line.cuda_version and line.cuda_patch
        assert line.cuda_patch.startswith(line.cuda_version + ".")
        # What the probe reads back from a board on that line names the line.
        l4t = parse_l4t(line.l4t_release)
        assert l4t is not None and l4t.split(".")[0] == str(line.l4t_major)
        assert line_for_version(jetpack_for(l4t)) is line


def test_build_code_uses_each_lines_cuda_and_glibc():
    for line in board_lines().values():
        for family in line.families:
            profile = with_jetpack(PROFILES[f"{family}-agx-{'64' if family == 'orin' else '128'}gb"], line.jetpack)
            target = profile_target(profile)
            assert target.cuda_major == line.cuda_major, (family, line.jetpack)
            assert target.cuda_version == line.cuda_version
            assert target.glibc_max == line.glibc
            # The board reports a JetPack version (7.2 → "7.2", R38.2 → "7.0"): the same glibc limit.
            reported = jetpack_for(parse_l4t(line.l4t_release or ""))
            assert profile_target(profile, jetpack=reported).glibc_max == line.glibc
    assert {f: resolve_target(f).cuda_major for f in DEFAULT_LINES} == {
        f: JETPACK_LINES[jp].cuda_major for f, jp in DEFAULT_LINES.items()}
    assert JETPACK_LINES["6"].cuda_major == 12 and JETPACK_LINES["7"].cuda_major == 13
    assert JETPACK_LINES["7.2"].cuda_major == 13


def test_vllm_images_per_line():
    assert set(IMAGES) <= set(board_lines())  # the vLLM engine's table names lines this table has
    for line in board_lines().values():
        assert set(IMAGES.get(line.jetpack, {})) <= set(line.families)
        for family in line.families:
            assert default_image(f"{family}-x", line.jetpack) == IMAGES[line.jetpack][family]
    with pytest.raises(EdgekitError):
        default_image("orin-nano-8gb", "5.1")


def test_lines_no_profile_runs_are_refused():
    with pytest.raises(EdgekitError, match=r"Unknown JetPack line '5'; known: 6, 7, 7.2"):
        with_jetpack(PROFILES["orin-agx-64gb"], "5")
    with pytest.raises(EdgekitError, match="does not run on Thor"):
        with_jetpack(PROFILES["thor-agx-128gb"], "6")


def test_table_imports_only_errors_of_edgekit():
    tree = ast.parse(Path(jetpack.__file__).read_text())
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    imported |= {a.name for node in ast.walk(tree) if isinstance(node, ast.Import) for a in node.names}
    assert {m for m in imported if m and m.startswith("edgekit")} <= {"edgekit.errors"}
