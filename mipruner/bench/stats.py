"""Medians with a distribution-free 95% interval (order statistics), for the benchmark reports.

For n timed runs sorted x(1) <= ... <= x(n), the interval [x(j), x(n + 1 - j)] holds the true median
with probability 1 - 2 P(B <= j - 1), B ~ Binomial(n, 1/2) (each run falls below the median with
probability 1/2). `median_ci` takes the largest j whose coverage is at least `level`. No resampling, so
the interval is the same on every machine for the same runs; with fewer than 6 runs no 95% interval
exists (None). n = 30 gives j = 10: [x(10), x(21)], coverage 95.7%.
"""
from __future__ import annotations

import math
import statistics

METHOD = "order-statistic (binomial) interval of the median, distribution-free"


def _below(n: int, j: int) -> float:
    """P(B <= j) for B ~ Binomial(n, 1/2)."""
    return sum(math.comb(n, i) for i in range(j + 1)) / 2 ** n


def ci_ranks(n: int, level: float = 0.95) -> tuple[int, int, float] | None:
    """(j, k, coverage): 1-based ranks of the interval's ends and its exact coverage; None when none exists."""
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    best = None
    for j in range(1, n // 2 + 1):
        coverage = 1 - 2 * _below(n, j - 1)
        if coverage < level:
            break
        best = (j, n + 1 - j, coverage)
    return best


def median_ci(values: list[float], level: float = 0.95) -> dict:
    """{'median', 'low', 'high', 'coverage', 'n'} of `values` (low/high/coverage None when n is too small)."""
    if not values:
        raise ValueError("no values")
    xs = sorted(values)
    ranks = ci_ranks(len(xs), level)
    low, high, cov = (xs[ranks[0] - 1], xs[ranks[1] - 1], round(ranks[2], 4)) if ranks else (None, None, None)
    return {"median": statistics.median(xs), "low": low, "high": high, "coverage": cov, "n": len(xs)}


def ratio_text(a: dict, b: dict) -> str:
    """'0.41 (0.38-0.44)': a's median over b's, with the interval ends' ratio bounds (low/high, high/low)
    where both intervals exist: a conservative range for paired, interleaved cells."""
    r = a["median"] / b["median"]
    if a["low"] is None or b["low"] is None:
        return f"{r:.3f}"
    return f"{r:.3f} ({a['low'] / b['high']:.3f}-{a['high'] / b['low']:.3f})"
