"""`cuda-tree`: the board's CUDA target tree (include/ and lib/ of /usr/local/cuda/targets/aarch64-linux, symlinks
kept) as a tar stream on stdout, for a workstation that cross-builds against this board's JetPack
(`edgekit build sysroot`). Nothing is written on the board. ``$EDGEKIT_BOARD_ROOT`` is a simulated board's root
(empty on a real board). Standard library only (Python 3.8).
"""

from __future__ import annotations

import os
import sys
import tarfile

CUDA = "/usr/local/cuda"
TARGET = CUDA + "/targets/aarch64-linux"


class NoTree(ValueError):
    """What the board lacks: one sentence."""


def stream(out: object = None) -> int:
    root = os.environ.get("EDGEKIT_BOARD_ROOT", "")
    if not os.path.isdir(root + CUDA):
        raise NoTree(f"no CUDA toolkit at {CUDA}")
    tree = root + TARGET
    if not os.path.isfile(os.path.join(tree, "include", "cuda_runtime.h")):
        raise NoTree(f"no {TARGET}/include/cuda_runtime.h")
    sink = out if out is not None else sys.stdout.buffer
    with tarfile.open(fileobj=sink, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        for top in ("include", "lib"):
            if os.path.lexists(os.path.join(tree, top)):
                tar.add(os.path.join(tree, top), arcname=top)  # symlinks stay symlinks (dereference=False)
    return 0
