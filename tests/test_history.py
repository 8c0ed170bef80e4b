"""`edgekit history`: the results adapter, the SQLite store (two concurrent writers), plots, export, CLI.

`make_doc` builds schema-valid results documents (edgekit/data/results-schema.json) with chosen
per-repetition values; the gate tests import it too.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from cli_helpers import edgekit
from click.testing import CliRunner

from edgekit.bench import results as bench_results
from edgekit.cli import cli
from edgekit.history import export
from edgekit.history.metrics import metrics_from_results
from edgekit.history.store import History, default_db_path

REPO = Path(__file__).resolve().parents[1]

Series = dict[tuple[str, int, int | None], dict[str, list[float]]]


def _run(index: int, config: str, c: int, ctx: int | None, rep: int, tps: float, acc: float | None,
         jpt: float | None) -> dict[str, Any]:
    tokens = 64 * c
    duration = tokens / tps
    power: dict[str, Any] = {"available": False, "reason": "power unavailable"}
    if jpt is not None:
        power = {"available": True, "window_start": 10.0 * index, "window_end": 10.0 * index + duration,
                 "duration_s": duration, "total_energy_joules": jpt * tokens, "average_watts": jpt * tps,
                 "samples_in_window": 20, "sampling_rate_hz": 20.0, "max_gap_s": 0.05,
                 "rails_energy_joules": {"VDD_IN": jpt * tokens}, "joules_per_token": jpt}
    draft_n = 100 if acc is not None else 0
    return {"index": index, "config": config, "concurrency": c, "context_length": ctx, "repetition": rep,
            "window": {"start": 10.0 * index, "end": 10.0 * index + duration, "duration_s": duration},
            "requests": c, "errors": 0, "tokens": tokens, "tokens_per_second": tps, "ttft_p50_s": 0.05,
            "ttft_p95_s": 0.06, "decode_tokens_per_second_mean": tps, "latency_p50_s": 1.0, "latency_p95_s": 1.1,
            "draft_n": draft_n,
            "draft_n_accepted": round(draft_n * (acc or 0)), "acceptance": acc, "acceptance_by_category": {},
            "power": power, "requests_detail": []}


def make_doc(series: Series, *, board: str = "orin-1", recipe: str = "e2b-mtp",
             created: str = "2026-01-01T02:00:00+0000", release: str = "e2b-mtp-aaaa",
             llama_ref: str | None = "b1234 (build 4567)") -> dict[str, Any]:
    """A results document whose runs carry exactly ``series``' values (repetition i = list index i)."""
    runs, index = [], 0
    reps = max(len(v) for m in series.values() for v in m.values())
    for rep in range(reps):
        for (config, c, ctx), metrics in series.items():
            tps = metrics["tokens_per_second"]
            if rep >= len(tps):
                continue
            acc, jpt = metrics.get("acceptance"), metrics.get("joules_per_token")
            runs.append(_run(index, config, c, ctx, rep, tps[rep], acc[rep] if acc else None,
                             jpt[rep] if jpt else None))
            index += 1
    configs = sorted({k[0] for k in series})
    points = sorted({(k[1], k[2]) for k in series})
    summary = bench_results.summarize(runs)
    ups = bench_results.speedups(runs)
    return {
        "schema": "edgekit-bench/1", "kind": "bench", "created": created, "edgekit_version": "0.1.0",
        "board": {"name": board, "profile": "orin-agx-64gb", "sim": False, "nvpmodel": {"id": 0, "name": "MAXN"}},
        "profile": {"name": "orin-agx-64gb", "mem_bandwidth_gbs": 204.8, "total_power_rail": "VIN_SYS_5V0"},
        "release": {"id": release, "recipe": recipe, "server_args": [], "drafter": "drafter" in configs},
        "llama_cpp": {"ref": llama_ref}, "recipe": {"name": recipe, "runtime": {}, "bench": {}},
        "settings": {"points": [{"concurrency": c, "context_length": ctx} for c, ctx in points],
                     "repetitions": reps, "warmup": 1, "n_gen": 64, "quick": False, "order": configs,
                     "cooldown_temp_c": None, "exclusive": True, "sampler_hz": 20.0, "parallel": 1,
                     "requests_per_run": {"1": 1}},
        "configurations": [{"name": c, "server_args": [], "speculative": c == "drafter"} for c in configs],
        "service": {"before": None, "after": None},
        "power": {"available": False, "reason": "synthetic", "total_rail_method": None},
        "llama_bench": [], "runs": runs,
        "summary": {"points": summary, "speedups": ups, "headline": bench_results.headline(summary, ups, "m")},
        "roofline": {"mem_bandwidth_gbs": 204.8, "bytes_per_token": 1, "ceiling_tokens_per_second": None,
                     "measured_tokens_per_second": None, "measured_fraction": None},
        "phases": [],
    }


def night(day: int, tps: float = 40.0, *, reps: int = 5, spread: float = 0.01, **kw: Any) -> dict[str, Any]:
    """A plausible night: drafter and baseline at one point, values spread ±spread around tps."""
    wobble = [1 + spread * ((i * 7 + day * 3) % 5 - 2) / 2 for i in range(reps)]  # deterministic, mean 1
    series: Series = {
        ("drafter", 1, 128): {"tokens_per_second": [tps * w for w in wobble],
                              "acceptance": [0.7 * (1 + (w - 1) / 4) for w in wobble],
                              "joules_per_token": [0.5 / (tps * w) * 40 for w in wobble]},
        ("baseline", 1, 128): {"tokens_per_second": [tps / 1.8 * w for w in wobble],
                               "joules_per_token": [0.9 / (tps * w) * 40 for w in wobble]},
    }
    return make_doc(series, created=f"2026-01-{day:02d}T02:00:00+0000", **kw)


# ----------------------------------------------------------------------------------- adapter


def test_synthetic_documents_follow_the_results_schema() -> None:
    bench_results.validate(night(1))


def test_metrics_from_results_per_repetition_with_directions_and_labels() -> None:
    doc = night(3, reps=4)
    got = {m.series: m for m in metrics_from_results(doc)}
    assert set(got) == {"drafter/c1 ctx128/tokens_per_second", "baseline/c1 ctx128/tokens_per_second",
                        "drafter/c1 ctx128/acceptance", "drafter/c1 ctx128/joules_per_token",
                        "baseline/c1 ctx128/joules_per_token"}  # no acceptance without a drafter
    tps = got["drafter/c1 ctx128/tokens_per_second"]
    assert len(tps.values) == 4 and tps.direction == "bigger" and tps.unit == "tok/s"
    assert got["drafter/c1 ctx128/joules_per_token"].direction == "smaller"
    assert (tps.board, tps.recipe, tps.release, tps.llama_ref) == ("orin-1", "e2b-mtp", "e2b-mtp-aaaa",
                                                                    "b1234 (build 4567)")
    assert tps.values == tuple(r["tokens_per_second"] for r in doc["runs"] if r["config"] == "drafter")


def test_metrics_fall_back_to_summary_values_without_runs() -> None:
    doc = night(3)
    doc.pop("runs")
    got = {m.series: m.values for m in metrics_from_results(doc)}
    assert len(got["drafter/c1 ctx128/tokens_per_second"]) == 5
    assert "drafter/c1 ctx128/acceptance" in got  # a pooled number when there are no runs


@pytest.mark.parametrize("doc", [[], {"runs": []}, {"board": {"name": "x"}, "recipe": {"name": "y"}}])
def test_metrics_from_a_document_that_is_not_results_is_a_clear_error(doc: Any) -> None:
    from edgekit.errors import EdgekitError

    with pytest.raises(EdgekitError):
        metrics_from_results(doc)


# ----------------------------------------------------------------------------------- store


def test_add_is_idempotent_and_window_takes_recent_nights(tmp_path: Path) -> None:
    with History(tmp_path / "h.sqlite") as h:
        for day in range(1, 11):
            assert h.add(night(day)).new
        assert not h.add(night(4)).new  # the same document again: recorded once
        assert len(h.runs()) == 10
        cur = night(11)
        window = h.window("orin-1", "e2b-mtp", 7, until_ts=None)
        assert [r.created[:10] for r in window] == [f"2026-01-{d:02d}" for d in range(4, 11)]
        # A run in the history is not its own baseline; nights after it are not either.
        added = h.add(cur)
        w = h.window("orin-1", "e2b-mtp", 3, until_ts=added.run.created_ts, exclude_digest=added.run.digest)
        assert [r.created[8:10] for r in w] == ["08", "09", "10"]
        values = h.values([r.id for r in w])
        assert len(values["drafter/c1 ctx128/tokens_per_second"]) == 3
        # A new baseline start drops the nights before it.
        h.set_baseline(window[-2])  # night 9
        assert [r.created[8:10] for r in h.window("orin-1", "e2b-mtp", 7)] == ["09", "10", "11"]


def test_default_db_path_honours_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("EDGEKIT_HISTORY", str(tmp_path / "x.sqlite"))
    assert default_db_path() == tmp_path / "x.sqlite"
    monkeypatch.delenv("EDGEKIT_HISTORY")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    assert default_db_path() == tmp_path / "data" / "edgekit" / "history.sqlite"


def test_not_a_history_file_is_a_clear_error(tmp_path: Path) -> None:
    from edgekit.errors import EdgekitError

    bad = tmp_path / "h.sqlite"
    bad.write_text("this is not sqlite " * 100)
    with pytest.raises(EdgekitError, match="not an edgekit history"):
        History(bad)


_WRITER = textwrap.dedent("""
    import json, sys, time
    from pathlib import Path
    from edgekit.history.store import History
    db, docs, start = sys.argv[1], sys.argv[2:-1], float(sys.argv[-1])
    while time.time() < start:  # both writers begin together
        time.sleep(0.001)
    for path in docs:  # a connection per document: opening races too, as two CLI runs would
        with History(db) as h:
            h.add(json.loads(Path(path).read_text()), source=path)
""")


def test_two_concurrent_writer_processes(tmp_path: Path) -> None:
    docs = []
    for i in range(40):
        doc = night(1 + i % 28, tps=40 + i, board=f"orin-{i % 2}")
        doc["created"] = f"2026-{1 + i // 28:02d}-{1 + i % 28:02d}T02:00:00+0000"
        path = tmp_path / f"r{i}.json"
        path.write_text(json.dumps(doc))
        docs.append(path)
    db = tmp_path / "shared.sqlite"
    start = time.time() + 1.5
    procs = [subprocess.Popen([sys.executable, "-c", _WRITER, str(db), *map(str, docs[w::2]), str(start)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for w in range(2)]
    try:
        outs = [p.communicate(timeout=120) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for p, (_, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err[-2000:]
    with sqlite3.connect(db) as con:
        assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert con.execute("SELECT count(*) FROM runs").fetchone()[0] == 40
        # 5 series × 5 repetitions per document, none lost or doubled
        assert con.execute("SELECT count(*) FROM samples").fetchone()[0] == 40 * 25
        assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


# ----------------------------------------------------------------------------------- plots, export


def _history_with_a_llama_bump(db: Path) -> None:
    with History(db) as h:
        for day in range(1, 9):
            h.add(night(day, tps=40 if day < 5 else 36, release="r1" if day < 5 else "r2",
                        llama_ref="b1" if day < 5 else "b2"))
        h.add(night(3, board="thor-1"))


def test_plots_one_png_per_board_recipe_and_metric_with_trends_markdown(tmp_path: Path) -> None:
    from edgekit.history.plots import _markers, grouped, trends_markdown, write_plots

    db = tmp_path / "h.sqlite"
    _history_with_a_llama_bump(db)
    with History(db) as h:
        files = write_plots(h, tmp_path / "plots")
        md = trends_markdown(h, images=files)
        rows = grouped(h, "orin-1", "tokens_per_second")[("orin-1", "e2b-mtp", "tokens_per_second")]
    assert sorted(p.name for p in files) == sorted(f"{b}-e2b-mtp-{m}.png" for b in ("orin-1", "thor-1")
                                                   for m in ("tokens_per_second", "acceptance", "joules_per_token"))
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 5000 for p in files)
    assert [(k, t) for _, k, t in _markers(rows)] == [("llama", "llama.cpp b2")]
    assert "```mermaid" in md and "xychart-beta" in md and "orin-1 e2b-mtp: tok/s drafter c1 ctx128" in md


def test_export_github_action_benchmark_format(tmp_path: Path) -> None:
    data = export.from_results(night(2))
    assert set(data) == {"customBiggerIsBetter", "customSmallerIsBetter"}
    bigger = {e["name"]: e for e in data["customBiggerIsBetter"]}
    smaller = {e["name"] for e in data["customSmallerIsBetter"]}
    entry = bigger["orin-1 e2b-mtp drafter c1 ctx128 tok/s"]
    assert entry["unit"] == "tok/s" and entry["value"] == pytest.approx(40.0, rel=0.01)
    assert entry["range"].startswith("± ") and "release=e2b-mtp-aaaa" in entry["extra"]
    assert "orin-1 e2b-mtp drafter c1 ctx128 acceptance" in bigger
    assert smaller == {"orin-1 e2b-mtp drafter c1 ctx128 J/token", "orin-1 e2b-mtp baseline c1 ctx128 J/token"}
    for entries in data.values():
        assert all(set(e) <= {"name", "unit", "value", "range", "extra"} for e in entries)
        assert all(isinstance(e["value"], float) for e in entries)


# ----------------------------------------------------------------------------------- CLI


def _invoke(*args: str) -> Any:
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def test_cli_add_show_plot_export(tmp_path: Path) -> None:
    db = str(tmp_path / "h.sqlite")
    files = []
    for day in (1, 2, 3):
        p = tmp_path / f"n{day}.json"
        p.write_text(json.dumps(night(day)))
        files.append(str(p))
    res = _invoke("--json", "history", "add", *files, "--db", db)
    assert res.exit_code == 0, res.output
    assert [r["new"] for r in json.loads(res.output)["runs"]] == [True, True, True]
    res = _invoke("history", "add", files[0], "--db", db)
    assert "already recorded" in res.output

    res = _invoke("history", "show", "--db", db, "--board", "orin-1", "--metric", "tokens_per_second", "--json")
    rows = json.loads(res.output)
    assert len(rows) == 6 and {r["metric"] for r in rows} == {"tokens_per_second"}
    res = _invoke("history", "show", "--db", db, "--last", "1")
    assert "tok/s drafter c1 ctx128" in res.output and "2026-01-03" in res.output and "2026-01-02" not in res.output

    res = _invoke("history", "plot", "--db", db, "--out", str(tmp_path / "p"))
    assert res.exit_code == 0 and (tmp_path / "p" / "orin-1-e2b-mtp-tokens_per_second.png").is_file()
    assert (tmp_path / "p" / "trends.md").read_text().count("```mermaid") == 5

    res = _invoke("history", "export", "--db", db, "--out", str(tmp_path / "e"))
    assert res.exit_code == 0
    bigger = json.loads((tmp_path / "e" / "customBiggerIsBetter.json").read_text())
    assert len(bigger) == 3 and all("2026" not in e["name"] for e in bigger)
    res = _invoke("history", "export", files[1], "--json")
    assert json.loads(res.output)["customSmallerIsBetter"]


def test_cli_user_errors_exit_2_with_one_sentence(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    for args in (["history", "add", str(bad)], ["history", "add", str(tmp_path / "missing.json")],
                 ["gate", "--current", str(bad)], ["gate", "--current", str(tmp_path / "x.json")]):
        res = edgekit(*args, "--db", str(tmp_path / "h.sqlite"), timeout=60)
        assert res.returncode == 2, res.stderr
        assert res.stderr.startswith("edgekit: ") and "Traceback" not in res.stderr
