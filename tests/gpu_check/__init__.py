"""GPU acceptance (`python -m tests.gpu_check run`: every family x media x method on one device, the paper's
protocol, one report) and its scheduling on lent GPU machines (per-call time limits, the first H100 run's
timings, report merging: `plan`, `merge`). Run from the repository root. Maintainers' tools, not in the wheel:
what a user runs is `mipruner-bench` and its reports."""
