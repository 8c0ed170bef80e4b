"""Shared by the build tests (and usable from conftest.py): the sdist source and built artifacts.

The sdist comes from PyPI once and then from ~/.cache/edgekit; without network and without a
cached copy the tests that need it are skipped locally, and fail in CI (where PyPI is reachable).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from edgekit.build import fetch_sdist
from edgekit.errors import EdgekitError


def sdist_or_skip() -> Path:
    try:
        return fetch_sdist()
    except EdgekitError as exc:
        if os.environ.get("CI"):
            raise
        pytest.skip(f"llama-cpp-python sdist neither cached nor downloadable: {exc}")
