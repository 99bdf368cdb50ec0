"""CDPruner: greedy MAP of a conditional DPP over the visual tokens (Zhang et al. 2025).

    v~, t~       L2-normalised rows of V (N_V, d) and T (N_T, d)
    x_i  = mean_m ( -cos(v_i, t_m) )                                   (N_V,)
    r_i  = (x_i - min x + 1e-6) / (max x - min x)   (MinMax; all ones when x is constant)
    q_i  = exp(alpha r_i), alpha = theta / (2 (1 - theta))   for theta < 1;   q_i = r_i for theta = 1
    S    = v~ v~^T   (N_V, N_V) cosine matrix;     L = diag(q) S diag(q)
    pick K tokens by greedy MAP:  S_{k+1} = S_k + argmax_i det(L_{S_k + i}) / det(L_{S_k})

The sign: the released code scores relevance with the NEGATED cosine between image and text
features, and we keep it so the baseline is faithful (its original inputs were CLIP features; here,
as in later ports, the LLM-space V and T). The 1e-6 in the MinMax numerator is also as released.

theta (Chen, Zhang & Zhou 2018, Sec. 5): with q_i = exp(alpha r_i),
    log det L_Y = 2 alpha sum_{i in Y} r_i + log det S_Y,
so (1 - theta) log det L_Y = theta sum_{i in Y} r_i + (1 - theta) log det S_Y: theta trades total
relevance against diversity; theta = 0 ignores the prompt (plain DPP on S). The released code ships
this weighting commented out (kernel diag(r) S diag(r)); later ports enable it with theta = 0.5 and
treat theta = 1 as "no exponential weighting", i.e. the released kernel. We follow that convention,
so theta = 1 reproduces the released code exactly; note it is not the limit theta -> 1 (which
would be a pure top-K by relevance).

Greedy MAP with incremental Cholesky (Chen et al. 2018, Alg. 1). For the selected set S (in pick
order) keep c_i (|S|,) and d_i^2 = det(L_{S+i}) / det(L_S), the Schur complement of L_S in L_{S+i}:
    init:   d_i^2 = L_ii,  c_i = ()
    pick:   j = argmax_{i not in S} d_i^2
    update: e_i = (L_ji - <c_j, c_i>) / d_j;   c_i <- (c_i, e_i);   d_i^2 <- d_i^2 - e_i^2
O(N_V K) per step, O(N_V K^2) in all, plus the kernel. Up to `mi.DENSE_LIMIT` tokens S is built
once with `gram()`; above it, the one column S[:, j] each step needs is recomputed, O(N_V d).

Rank exhaustion: L has rank at most min(N_V, d), and duplicated tokens lower it further. Once every
remaining d_i^2 is below `_EPS` * max_i L_ii, no remaining token can add volume; the greedy stops
updating and the remaining picks follow in decreasing q (relevance), ties to the lowest index.

Scores: d_i^2 (the determinant ratio) at the step a token was picked; for tokens never picked,
their d_i^2 given the final set. Both clamped at 0 (rounding can leave -1e-8).
"""
from __future__ import annotations

import math

import torch

from ._registry import Param, register_pruner
from .divprune import CosineColumns
from .selection import Selection, check_range, cosine_to

_EPS = 1e-6  # relative floor on d_i^2: below it a token adds no volume in float32 (rank exhausted)
_MINMAX_EPS = 1e-6  # as in the released code: keeps the least relevant token's weight above 0


def relevance(visual: torch.Tensor, text: torch.Tensor) -> torch.Tensor:
    """r_i = MinMax_i( mean_m -cos(v_i, t_m) ): (N_V,) float32, the released code's relevance."""
    x = -cosine_to(visual, text).mean(dim=1)  # (N_V, N_T) -> (N_V,), note the minus
    lo, hi = x.min(), x.max()
    if float(hi - lo) <= 0.0:
        return torch.ones_like(x)  # a constant relevance carries no information: weight all alike
    return (x - lo + _MINMAX_EPS) / (hi - lo)


def quality(r: torch.Tensor, theta: float) -> torch.Tensor:
    """Per-token kernel weight q (N_V,): exp(alpha r) with alpha = theta / (2(1 - theta)); r at theta = 1."""
    if theta == 1.0:
        return r  # the released kernel diag(r) S diag(r)
    alpha = theta / (2.0 * (1.0 - theta))
    return torch.exp(alpha * r)


def greedy_map(kernel_row, diag: torch.Tensor, k: int, fallback: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy MAP of the DPP with kernel L, by incremental Cholesky (Chen et al. 2018, Alg. 1).

    kernel_row(j) -> L[j, :] (N,); diag: L_ii (N,); k picks; fallback (N,): the priority for the
    picks left once the kernel's rank is exhausted. Returns (order (k,), scores (N,)): a picked
    token's d^2 when picked, an unpicked token's d^2 given the final set.
    """
    n = diag.shape[0]
    d2 = diag.to(torch.float32).clone()  # (N,) d_i^2 = det(L_{S+i}) / det(L_S)
    c = torch.zeros(k, n)  # (K, N) row s holds e_i of step s; c_i is the column c[:s, i]
    order = torch.empty(k, dtype=torch.long)
    scores = torch.empty(n)
    taken = torch.zeros(n, dtype=torch.bool)
    floor = _EPS * max(float(diag.max()), 0.0)
    exhausted = False
    for step in range(k):
        if not exhausted:
            j = int(d2.masked_fill(taken, -math.inf).argmax())  # ties to the lowest index
            exhausted = float(d2[j]) <= floor
        if exhausted:  # no token adds volume: take the rest by the fallback priority
            j = int(fallback.masked_fill(taken, -math.inf).argmax())
        order[step], scores[j], taken[j] = j, d2[j], True
        if exhausted:
            continue
        e = (kernel_row(j) - c[:step, j] @ c[:step]) / math.sqrt(float(d2[j]))  # (N,)
        c[step] = e
        d2 = d2 - e * e  # (N,)
    scores[~taken] = d2[~taken]
    return order, scores.clamp_min(0.0)


@register_pruner("cdpruner", needs=("text",), label="CDPruner", score_label="DPP gain d² (kernel units)", params=(
    Param.real("theta", 0.5, 0.0, 1.0, "relevance weight of the kernel (1 = the released kernel)", step=0.05),))
def cdpruner(visual: torch.Tensor, text: torch.Tensor, budget: int, *,
             theta: float = 0.5,  # later ports' default (Chen et al. 2018 weighting); 1 = released kernel
             ) -> Selection:
    """CDPruner: greedy MAP of a DPP whose kernel weighs visual similarity by prompt relevance."""
    theta = check_range("theta", theta, 0.0, 1.0)
    r = relevance(visual, text)  # (N_V,)
    q = quality(r, theta)  # (N_V,)
    cos = CosineColumns(visual)  # S, dense up to mi.DENSE_LIMIT

    def kernel_row(j: int) -> torch.Tensor:
        return q[j] * q * cos.col(j)  # L[j, :] = q_j q_i S_ij, (N_V,)

    diag = q * q * (cos.u * cos.u).sum(dim=1)  # (N_V,) L_ii = q_i^2 (0 for a zero-norm row)
    order, scores = greedy_map(kernel_row, diag, budget, fallback=q)
    return Selection.from_order(order, scores, extras={"relevance": r, "quality": q})
