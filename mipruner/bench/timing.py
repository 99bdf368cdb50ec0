"""Small timing helpers shared by the benchmark commands (and the text table they print)."""
from __future__ import annotations

import statistics
import time
from typing import Callable

from ..measure.text_table import table  # noqa: F401  (the benches print with it)


def measure(fn: Callable[[], object], repeats: int = 7, warmup: int = 1, budget_s: float = 3.0) -> list[float]:
    """Run `fn` `warmup` times, then up to `repeats` times (stopping early once `budget_s` is
    spent, after at least one run); return the timed runs in seconds. A warm-up run slower than
    `budget_s` is itself the measurement: multi-second cells are run once, cold."""
    for _ in range(warmup):
        t0 = time.perf_counter()
        fn()
        first = time.perf_counter() - t0
        if first > budget_s:
            return [first]
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < repeats:
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
        if time.perf_counter() - start > budget_s:
            break
    return times


def median_ms(times: list[float]) -> float:
    return statistics.median(times) * 1e3
