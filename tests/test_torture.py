"""The torture benchmark's short run (benchmarks/torture.py): twelve deploys on a simulated board, each hit by a
fault at a random instant — the deploying edgekit killed, a power cut, a hung server, the link cut, the link
stalled, the disk filled (where this machine lets us mount a tmpfs), two of each — and after every one the board
keeps every invariant (edgekit.sim.faults.violations); a last deploy finishes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from edgekit.sim import faults

REPO = Path(__file__).resolve().parents[1]


def test_twelve_faulted_deploys_leave_every_invariant_standing(tmp_path: Path) -> None:
    kinds = ["kill", "power", "hang", "cut", "stall"] + (["disk"] if faults.can_mount() else [])
    rounds = 2 * len(kinds)
    res = subprocess.run([sys.executable, str(REPO / "benchmarks" / "torture.py"), "--rounds", str(rounds), "--boards",
                          "1",
                          "--seed", "7", "--out", str(tmp_path)], capture_output=True, text=True, timeout=1800)
    assert (tmp_path / "torture.json").is_file(), res.stderr[-3000:]
    doc = json.loads((tmp_path / "torture.json").read_text())
    assert res.returncode == 0, (tmp_path / "torture.md").read_text()
    assert {row["fault"]: row["rounds"] for row in doc["summary"]} == dict.fromkeys(kinds, 2)
    assert all(row["violations"] == 0 for row in doc["summary"]) and doc["final_ok"] == 1
    assert all(r["recovered_s"] is not None and not r["violations"] for r in doc["per_round"])
    assert len({r["at_s"] for r in doc["per_round"]}) == rounds  # each fault at its own instant
    assert res.stdout.lstrip().startswith("{") and "| stall | 2 | 0 |" in res.stdout
