"""The rate-limited link of benchmarks/link_rate.py (edgekit.sim.netns: a namespace behind a tbf-capped veth): a
push by each path crosses it and lands verified, and the bytes counted on the link are the blob's and little more.
Its speed is the benchmark's figure, not asserted here."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from edgekit.sim import netns

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(not netns.available(), reason="needs root and iproute2 (network namespaces)")


def test_pushes_cross_a_capped_link_in_a_namespace(tmp_path: Path) -> None:
    res = subprocess.run([sys.executable, str(REPO / "benchmarks" / "link_rate.py"), "--rates", "200", "--size-mib",
                          "8", "--out", str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert res.returncode in (0, 1), res.stderr[-3000:]  # 1: under the goal, which this short push may be
    doc = json.loads((tmp_path / "link_rate.json").read_text())
    assert [r["path"] for r in doc["rows"]] == ["openssh", "sftp"]
    for row in doc["rows"]:
        # Everything the push sent went through the capped veth: the blob, plus framing and commands.
        assert 8 << 20 <= row["link_bytes"] <= (8 << 20) * 1.05 + 1e6, row
        assert 0 < row["ratio"] <= 1.02, row  # no faster than the cap allows
    assert "| 200 Mbit/s | openssh |" in res.stdout
