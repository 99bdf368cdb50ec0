"""Small timing helpers shared by the benchmark commands."""
from __future__ import annotations

import statistics
import time
from typing import Callable


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


def table(rows: list[list[str]], header: list[str]) -> str:
    """A plain left/right aligned text table."""
    cols = [header] + rows
    widths = [max(len(str(r[i])) for r in cols) for i in range(len(header))]
    fmt = lambda r: "  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w)  # noqa: E731
                              for i, (c, w) in enumerate(zip(r, widths)))
    return "\n".join([fmt(header), "  ".join("-" * w for w in widths)] + [fmt(r) for r in rows])
