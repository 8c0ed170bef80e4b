"""tegrastats: rail parsing on real lines (tests/data/tegrastats/), and the streaming source run
against a stand-in ``tegrastats`` executable that prints those lines at the requested interval."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from test_agent_support import run_agent, tegrastats_lines

from edgekit.agent import energy, sources
from edgekit.agent.tegrastats import parse_power

EXPECTED = {
    "orin-agx-jp5.txt": [{"VDD_GPU_SOC": 2390, "VDD_CPU_CV": 796, "VIN_SYS_5V0": 3522, "VDDQ_VDD2_1V8AO": 301}],
    "orin-agx-jp7.2.txt": [{"VDD_GPU_SOC": 5139, "VDD_CPU_CV": 3268, "VIN_SYS_5V0": 5500}],
    "orin-nx-jp6.txt": [{"VDD_IN": 17946, "VDD_CPU_GPU_CV": 8896, "VDD_SOC": 3923}],
    "thor-jp7.0.txt": [
        {"VDD_GPU": 0, "VDD_CPU_SOC_MSS": 5535, "VIN_SYS_5V0": 5040, "VIN": 16802},
        {"VDD_GPU": 1962, "VDD_CPU_SOC_MSS": 5887, "VIN_SYS_5V0": 5635, "VIN": 19780},
    ],
    "thor-jp7.2.txt": [
        {"VDD_GPU": 37528, "VDD_CPU_SOC_MSS": 18961, "VIN_SYS_5V0": 18331, "VIN": 87426},
        {"VDD_GPU": 1975, "VDD_CPU_SOC_MSS": 5530},
    ],
    "tx2-jp4.txt": [{"VDD_SYS_GPU": 182, "VDD_SYS_SOC": 730, "VDD_4V0_WIFI": 0, "VDD_IN": 5297, "VDD_SYS_CPU": 1917,
                     "VDD_SYS_DDR": 1241}],
}
TOTALS = {"orin-agx-jp5.txt": "VIN_SYS_5V0", "orin-agx-jp7.2.txt": "VIN_SYS_5V0", "orin-nx-jp6.txt": "VDD_IN",
          "thor-jp7.0.txt": "VIN", "thor-jp7.2.txt": "VIN", "tx2-jp4.txt": "VDD_IN"}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_parse_real_lines(name: str) -> None:
    lines = tegrastats_lines(name)
    assert [parse_power(ln) for ln in lines] == EXPECTED[name]
    total, is_sum = sources.choose_total(sorted(parse_power(lines[0])))
    assert (total, is_sum) == (TOTALS[name], False)


def test_every_data_file_is_covered_and_sourced() -> None:
    data = Path(__file__).resolve().parent / "data" / "tegrastats"
    files = sorted(p.name for p in data.glob("*.txt"))
    assert files == sorted(EXPECTED)
    for name in files:
        assert "Source:" in (data / name).read_text(), f"{name} does not say where its lines came from"


def test_parse_edge_cases() -> None:
    assert parse_power("VDD_GPU -392mW/-392mW VDD_CPU_SOC_MSS 3924mW/3835mW") == {
        "VDD_GPU": -392, "VDD_CPU_SOC_MSS": 3924}  # R38 Thor: a gated GPU rail reads negative
    assert parse_power("RAM 2257/30536MB (lfb 5392x4MB) SWAP 0/15268MB (cached 0MB) IRAM 0/252kB(lfb 252kB)") == {}
    assert parse_power("cpu@40.281C/40.281C EMC_FREQ 0%@204 GR3D_FREQ 12%@[1300,1300]") == {}
    assert parse_power("") == {}


FAKE_TEGRASTATS = """#!{python}
# Stand-in tegrastats: prints the given lines, one per --interval ms, until killed.
import sys, time
lines = [ln for ln in open({data!r}).read().splitlines() if ln.strip() and not ln.startswith("#")]
interval = int(sys.argv[sys.argv.index("--interval") + 1]) / 1000.0
i = 0
while True:
    sys.stdout.write(lines[i % len(lines)] + "\\n")
    sys.stdout.flush()
    i += 1
    time.sleep(interval)
"""


def _fake_tegrastats(tmp_path: Path, data_file: str) -> Path:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    exe = bindir / "tegrastats"
    data = Path(__file__).resolve().parent / "data" / "tegrastats" / data_file
    exe.write_text(FAKE_TEGRASTATS.format(python=sys.executable, data=str(data)))
    exe.chmod(0o755)
    return bindir


@pytest.mark.parametrize(("data_file", "total"), [("orin-nx-jp6.txt", "VDD_IN"), ("thor-jp7.2.txt", "VIN")])
def test_sampler_over_tegrastats(tmp_path: Path, data_file: str, total: str) -> None:
    bindir = _fake_tegrastats(tmp_path, data_file)
    root = tmp_path / "root"  # no hwmon tree, no jtop socket: auto must come to tegrastats
    root.mkdir()
    out = tmp_path / "s.jsonl"
    res = run_agent(["sample", "--out", str(out), "--hz", "20", "--duration", "1.5"], root, path_prefix=bindir)
    assert res.returncode == 0, res.stderr
    summary = json.loads(res.stdout)
    assert summary["source"] == "tegrastats" and summary["total_rail"] == total
    meta, samples, end = energy.read_samples(str(out))
    assert meta["interval_ms"] == 50 and set(meta["skipped"]) == {"jtop", "hwmon"}
    first = parse_power(tegrastats_lines(data_file)[0])
    assert samples[0]["rails"] == {k: float(v) for k, v in first.items()}
    assert samples[0]["total_mw"] == float(first[total])
    assert end["sampling_rate_hz"] >= 10.0
    # tegrastats is stopped with the sampler: no stand-in left running.
    assert not [p for p in os.listdir("/proc") if p.isdigit() and str(bindir / "tegrastats") in _cmdline(p)]


def _cmdline(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""
