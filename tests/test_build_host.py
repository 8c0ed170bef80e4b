"""Real llama.cpp builds from the PyPI sdist: the host CPU build (later tests deploy it) and the
aarch64 CPU cross build run under qemu. Cold ≈ 4–5 min each on 2 cores; cached < 1 s."""

from __future__ import annotations

import json
import shutil
import subprocess
import time

import pytest
from build_helpers import sdist_or_skip
from click.testing import CliRunner

from edgekit.build import BINARIES, LLAMA_CPP_SHORT, BuildOptions, BuildResult, build, host_build_for_tests
from edgekit.build.elf import read_header
from edgekit.cli import cli


@pytest.fixture(scope="session")
def host_build() -> BuildResult:
    """The host CPU build (x86_64) — what simulated boards run. Reuse it in deploy tests."""
    sdist_or_skip()
    return host_build_for_tests()


def test_host_build_ships_verified_binaries(host_build: BuildResult) -> None:
    manifest = host_build.artifact.manifest
    assert manifest["ref"]["short"] == LLAMA_CPP_SHORT and manifest["source"]["commit"].startswith(LLAMA_CPP_SHORT)
    assert {f"bin/{b}" for b in BINARIES} <= {c["name"] for c in manifest["contents"]}
    assert all(len(c["sha256"]) == 64 for c in manifest["contents"] if "sha256" in c)
    assert set(manifest["verify"]["machine"].values()) == {"x86_64"}
    assert f"commit {LLAMA_CPP_SHORT}" in manifest["verify"]["version_output"]
    assert manifest["compilers"]["cxx"] and manifest["compilers"]["cmake"].startswith("cmake version")
    assert "build.log" in {f["name"] for f in manifest["files"]}
    server = host_build.bin_dir / "llama-server"
    out = subprocess.run([str(server), "--version"], capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"},
                         check=True)
    assert "version:" in out.stdout + out.stderr  # found its .so files through RUNPATH $ORIGIN
    dyn = subprocess.run(["readelf", "-d", str(server)], capture_output=True, text=True, check=True).stdout
    assert "[$ORIGIN]" in dyn


def test_same_inputs_skip_the_build_within_a_second(host_build: BuildResult) -> None:
    start = time.monotonic()
    again = host_build_for_tests()
    assert again.cached and again.artifact.key == host_build.artifact.key
    assert time.monotonic() - start < 1.0


def test_cli_build_reports_the_cached_artifact(host_build: BuildResult) -> None:
    sdist = sdist_or_skip()
    res = CliRunner().invoke(cli, ["build", "--target", "host", "--src", str(sdist), "--json"],
                             catch_exceptions=False)
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["cached"] is True and data["key"] == host_build.artifact.key


@pytest.mark.aarch64_release
@pytest.mark.skipif(shutil.which("aarch64-linux-gnu-g++") is None or shutil.which("qemu-aarch64") is None,
                    reason="needs g++-aarch64-linux-gnu and qemu-user")
def test_aarch64_cpu_cross_build_runs_under_qemu() -> None:
    sdist = sdist_or_skip()
    result = build(BuildOptions(target="orin", cpu_only=True, src=str(sdist)))
    verify = result.artifact.manifest["verify"]
    assert set(verify["machine"].values()) == {"aarch64"}
    assert verify["version_runner"][0].endswith("qemu-aarch64")
    assert f"commit {LLAMA_CPP_SHORT}" in verify["version_output"]
    assert tuple(map(int, verify["glibc_needed"].split("."))) <= (2, 35)  # JetPack 6 (Ubuntu 22.04)
    assert read_header(result.bin_dir / "llama-server").machine == "aarch64"
    assert result.artifact.manifest["cmake"]["toolchain"].startswith("set(CMAKE_SYSTEM_NAME Linux)")


def test_without_github_the_pinned_source_comes_from_the_pypi_sdist(tmp_path, monkeypatch) -> None:
    # A workstation that reaches only PyPI: the default source (a GitHub clone) fails, and edgekit says
    # so and takes the same commit from the llama-cpp-python sdist instead of failing.
    from edgekit.build import source

    sdist = sdist_or_skip()
    cache = tmp_path / "cache"
    (cache / "downloads" / "sdist").mkdir(parents=True)
    shutil.copyfile(sdist, cache / "downloads" / "sdist" / source.SDIST_FILENAME)
    monkeypatch.setenv("EDGEKIT_CACHE", str(cache))
    monkeypatch.setattr(source, "LLAMA_CPP_REPO", str(tmp_path / "no-such-remote"))  # GitHub, unreachable
    notes: list[str] = []
    got = source.resolve_source(None, note=notes.append)
    assert got.origin == "tarball" and got.identity.startswith(f"tar:{source.SDIST_SHA256}+patches:")
    assert source.is_llama_tree(got.path)
    assert len(notes) == 1 and "GitHub unreachable" in notes[0] and source.SDIST_REQUIREMENT in notes[0]
    assert not list((cache / "src").glob("llama.cpp-*"))  # no half-made clone left behind
    # Next time the unpacked sdist is the pinned tree: GitHub is not asked again, nothing is said.
    assert source.resolve_source(None, note=notes.append) == got and len(notes) == 1
