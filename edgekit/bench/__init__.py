"""On-board benchmarks: workloads, power, statistics, results, report, roofline and tune (docs/bench.md)."""
