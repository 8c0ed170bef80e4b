"""The CUDA wheels of the aarch64 cross tree: each pinned by sha256 and checked before use, and unpacked only
into the tree (no member may land outside it). No network: crafted wheels and fake pins."""

from __future__ import annotations

import hashlib
import stat
import zipfile
from pathlib import Path

import pytest

from edgekit.build import cuda
from edgekit.build.cuda import WHEEL_SHA256, _pinned_name, _unpack_wheel, verify_wheel
from edgekit.errors import EdgekitError


def make_wheel(path: Path, members: dict[str, bytes], symlinks: dict[str, str] | None = None) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in members.items():
            zf.writestr(zipfile.ZipInfo(name), data)
        for name, target in (symlinks or {}).items():
            info = zipfile.ZipInfo(name)
            info.external_attr = (stat.S_IFLNK | 0o777) << 16
            zf.writestr(info, target)
    return path


def tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


GOOD = {"nvidia/cu13/include/cuda.h": b"/* h */", "nvidia/cu13/lib/libcudart.so.13": b"ELF"}


def test_a_wheel_unpacks_its_include_and_lib_into_dest(tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    dest.mkdir()
    _unpack_wheel(make_wheel(tmp_path / "ok.whl", {**GOOD, "nvidia_x-1.dist-info/RECORD": b""}), dest)
    assert tree(dest) == ["include", "include/cuda.h", "lib", "lib/libcudart.so.13"]


@pytest.mark.parametrize(("member", "why"), [
    ("../evil", "climbs out"),
    ("nvidia/cu13/lib/../../../evil", "climbs out"),
    ("/tmp/evil-absolute", "absolute"),
])
def test_a_wheel_with_a_member_outside_dest_is_refused_and_nothing_is_written(
        tmp_path: Path, member: str, why: str) -> None:
    dest = tmp_path / "work" / "dest"
    dest.mkdir(parents=True)
    # the good members come first: the wheel is refused before any of them is written
    wheel = make_wheel(tmp_path / "bad.whl", {**GOOD, member: b"pwned"})
    with zipfile.ZipFile(wheel) as zf:
        assert member in zf.namelist()  # zipfile kept the name as crafted
    before = tree(tmp_path)
    with pytest.raises(EdgekitError, match=why) as err:
        _unpack_wheel(wheel, dest)
    assert str(err.value).startswith("Refusing to unpack the wheel bad.whl") and "\n" not in str(err.value)
    assert tree(tmp_path) == before and list(dest.iterdir()) == []
    assert not Path("/tmp/evil-absolute").exists()


def test_a_wheel_with_a_symlink_member_is_refused(tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    dest.mkdir()
    wheel = make_wheel(tmp_path / "link.whl", GOOD, symlinks={"nvidia/cu13/lib/libevil.so": "/etc/passwd"})
    with pytest.raises(EdgekitError, match="symbolic link"):
        _unpack_wheel(wheel, dest)
    assert list(dest.iterdir()) == []


def test_a_symlink_already_in_dest_does_not_lead_a_member_out(tmp_path: Path) -> None:
    dest, outside = tmp_path / "dest", tmp_path / "outside"
    dest.mkdir()
    outside.mkdir()
    (dest / "lib").symlink_to(outside)
    with pytest.raises(EdgekitError, match="outside"):
        _unpack_wheel(make_wheel(tmp_path / "ok.whl", GOOD), dest)
    assert list(outside.iterdir()) == [] and not (dest / "include").exists()


def test_a_wheel_whose_sha256_is_not_its_pin_is_refused(tmp_path: Path) -> None:
    wheel = tmp_path / "nvidia_fake-1.0-py3-none-manylinux2014_aarch64.whl"
    wheel.write_bytes(b"not the pinned bytes")
    good = hashlib.sha256(b"not the pinned bytes").hexdigest()
    verify_wheel(wheel, {wheel.name: good})  # the pinned bytes pass
    with pytest.raises(EdgekitError, match=r"The wheel nvidia_fake-1\.0-.*\.whl has sha256 .* not the pinned") as err:
        verify_wheel(wheel, {wheel.name: "0" * 64})
    assert "\n" not in str(err.value)
    with pytest.raises(EdgekitError, match="not one edgekit pins"):
        verify_wheel(wheel, {})


def test_every_wheel_edgekit_downloads_is_pinned_by_sha256() -> None:
    for req in cuda.CUDA13_AARCH64_WHEELS:
        assert _pinned_name(req).endswith("_aarch64.whl")
    for machine in ("x86_64", "aarch64"):
        assert _pinned_name(cuda.CUOBJDUMP_WHEEL, machine)
    assert all(len(h) == 64 and int(h, 16) >= 0 for h in WHEEL_SHA256.values())
    with pytest.raises(EdgekitError, match="pins no"):
        _pinned_name("nvidia-cuda-runtime==99.0")


def test_the_tree_is_not_begun_when_a_downloaded_wheel_is_not_its_pin(tmp_path: Path, monkeypatch) -> None:
    # pip "downloads" files of the pinned names but the wrong bytes: nothing is laid out.
    monkeypatch.setattr(cuda, "host_nvcc", lambda: tmp_path / "cuda" / "bin" / "nvcc")
    monkeypatch.setattr(cuda, "nvcc_version", lambda _nvcc: "13.0.88")
    wheels_dir = tmp_path / "wheels"

    def fake_pip(reqs: list[str], dest: Path, _extra: list[str]) -> None:
        dest.mkdir(parents=True, exist_ok=True)
        for req in reqs:
            make_wheel(dest / _pinned_name(req), GOOD)

    laid = []
    monkeypatch.setattr(cuda, "pip_download", fake_pip)
    monkeypatch.setattr(cuda, "layout_cross_toolkit", lambda *a, **k: laid.append(a))
    with pytest.raises(EdgekitError, match="not the pinned"):
        cuda.assemble_wheel_tree(tmp_path / "tree", wheels_dir)
    assert laid == [] and not (tmp_path / "tree").exists()
