"""Scheduling `mipruner-bench gpu-check` on lent GPU machines (per-call time limits, the first H100 run's
timings, report merging). Run from the repository root: `python -m tests.gpu_check plan|merge ...`.
Not in the wheel: what a user runs is `mipruner-bench` and its reports."""
