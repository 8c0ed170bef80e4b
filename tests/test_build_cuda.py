"""CUDA cross builds with the host CUDA 13 nvcc + PyPI's aarch64 CUDA 13 wheels.

CI compiles one real ggml-cuda object per Jetson SM and checks its cubins; the full CUDA build
(≈ 15–25 min on 2 cores) is marked slow and run by hand: `pytest -m slow tests/test_build_cuda.py`.
"""

from __future__ import annotations

import shutil

import pytest
from build_helpers import sdist_or_skip

from edgekit.build import BuildOptions, build
from edgekit.build.builder import compile_objects
from edgekit.build.cuda import find_cuobjdump, host_nvcc
from edgekit.build.elf import cubin_archs, read_header
from edgekit.build.verify import cuobjdump_archs

pytestmark = pytest.mark.skipif(
    host_nvcc() is None or shutil.which("aarch64-linux-gnu-g++") is None,
    reason="needs a CUDA 13 nvcc and g++-aarch64-linux-gnu",
)


@pytest.mark.parametrize(("target", "sm"), [("orin", 87), ("thor", 110)])
def test_one_ggml_cuda_object_per_sm(target: str, sm: int) -> None:
    sdist = sdist_or_skip()
    # Orin on JetPack 6 would build on the board; "pypi" forces the CUDA 13 wheel tree here.
    options = BuildOptions(target=target, src=str(sdist), cuda_home="pypi")
    (obj,) = compile_objects(options, ["arange.cu"])
    assert read_header(obj).machine == "aarch64"
    assert cubin_archs(obj) == {sm: 1}
    tool = find_cuobjdump()
    if tool is not None:
        assert cuobjdump_archs(tool, obj) == {sm: 1}


@pytest.mark.slow
def test_full_thor_cuda_cross_build() -> None:
    sdist = sdist_or_skip()
    result = build(BuildOptions(target="thor", src=str(sdist)))
    verify = result.artifact.manifest["verify"]
    assert set(verify["machine"].values()) == {"aarch64"}
    assert verify["cubins"] and all(set(v) == {"sm_110"} for v in verify["cubins"].values())
    assert "version" in verify["version_output"]
