"""Benchmark history: a SQLite store of nightly results, the regression gate, trend plots, export.

    metrics.py  results document → per-repetition series (tok/s, acceptance, J/token)
    store.py    the SQLite file (WAL, busy timeout, one transaction per write)
    stats.py    bootstrap CI of the relative change against the recent nights
    gate.py     per-series verdicts and the gate's report
    plots.py    trend PNGs per board and metric, Mermaid charts for job summaries
    export.py   github-action-benchmark's customBiggerIsBetter / customSmallerIsBetter JSON
"""
