"""The torture benchmark's short run (benchmarks/torture.py): nine deploys on a simulated board, each hit by a
fault at a random instant — the deploying edgekit killed, a power cut, a hung server, three of each — and after
every one the board keeps every invariant (edgekit.sim.faults.violations); a last deploy finishes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_nine_faulted_deploys_leave_every_invariant_standing(tmp_path: Path) -> None:
    res = subprocess.run([sys.executable, str(REPO / "benchmarks" / "torture.py"), "--rounds", "9", "--boards", "1",
                          "--seed", "7", "--out", str(tmp_path)], capture_output=True, text=True, timeout=1800)
    assert (tmp_path / "torture.json").is_file(), res.stderr[-3000:]
    doc = json.loads((tmp_path / "torture.json").read_text())
    assert res.returncode == 0, (tmp_path / "torture.md").read_text()
    assert {row["fault"]: row["rounds"] for row in doc["summary"]} == {"kill": 3, "power": 3, "hang": 3}
    assert all(row["violations"] == 0 for row in doc["summary"]) and doc["final_ok"] == 1
    assert all(r["recovered_s"] is not None and not r["violations"] for r in doc["per_round"])
    assert len({r["at_s"] for r in doc["per_round"]}) == 9  # each fault at its own instant
    assert res.stdout.lstrip().startswith("{") and "| power | 3 | 0 |" in res.stdout
