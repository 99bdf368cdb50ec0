"""Stride: keep K of the N visual tokens evenly spaced in their original (raster) order.

A baseline that looks at no feature: token i of the K kept ones is

    index_i = floor((i * N + phase * (N - K)) / K),   i = 0 .. K-1,

so consecutive kept tokens are N / K >= 1 apart (no duplicates), the first is at least 0 and the last at
most N - 1; `phase` slides the pattern inside each stride (0: first token of the stride, 1: last).
Integer arithmetic only, on the device of the inputs: deterministic, and exact for any N and K.
"""
from __future__ import annotations

import math

import torch

from mipruner import Param, Selection, register_pruner


@register_pruner("stride", label="Stride (example plug-in)", score_label=None, params=(
    Param.real("stride_phase", 0.5, 0.0, 1.0, "where in each stride the kept token sits (0: first, 1: last)",
               code="sp"),))
def stride(visual: torch.Tensor, text, budget: int, *, stride_phase: float = 0.5) -> Selection:
    """Every (N_V / K)-th visual token in raster order: a feature-blind baseline."""
    n = visual.shape[0]
    offset = math.floor(stride_phase * (n - budget))  # a Python int: shape arithmetic, no tensor read
    order = (torch.arange(budget, device=visual.device, dtype=torch.long) * n + offset) // budget
    scores = torch.zeros(n, device=visual.device, dtype=torch.float32)  # no per-token score: score_label=None
    return Selection.from_order(order, scores)
