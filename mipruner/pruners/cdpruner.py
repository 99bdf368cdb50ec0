"""CDPruner: greedy MAP of a conditional DPP over the visual tokens (Zhang et al. 2025, "Beyond
Attention or Similarity: Maximizing Conditional Diversity for Token Pruning in MLLMs").

Original: Theia-4869/CDPruner, `llava/model/llava_arch.py` `LlavaMetaForCausalLM.encode_images`
(relevance, kernel and the greedy MAP loop). At the default theta = 1 ours selects what it selects.

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
would be a pure top-K by relevance). The default is theta = 1, the released kernel; theta < 1 is
kept as an option, the later ports' weighting (their default 0.5).

Deliberate deviations from the release, and why:
  * Inputs: the release scores CLIP's image features against CLIP text features of the prompt;
    the LLM-space V (projected tokens) and T (prompt embeddings) are what every method here sees,
    as in the later ports.
  * Rank exhaustion (below) picks the rest by relevance; the release would divide by ~0 there.
  * Ties go to the lowest index (argmax); the release's argmax does the same on one device.

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
from .capture import Capturable
from .divprune import CosineColumns
from .selection import Selection, cosine_to

_EPS = 1e-6  # relative floor on d_i^2: below it a token adds no volume in float32 (rank exhausted)
_MINMAX_EPS = 1e-6  # as in the released code: keeps the least relevant token's weight above 0
_TINY = torch.finfo(torch.float32).tiny  # keeps sqrt(d^2) away from 0 on a step whose update is discarded


def relevance(visual: torch.Tensor, text: torch.Tensor) -> torch.Tensor:
    """r_i = MinMax_i( mean_m -cos(v_i, t_m) ): (N_V,) float32, the released code's relevance."""
    x = -cosine_to(visual, text).mean(dim=1)  # (N_V, N_T) -> (N_V,), note the minus
    lo, hi = x.min(), x.max()
    # A constant relevance carries no information: weight all alike (decided on the device, no host copy).
    return torch.where(hi > lo, (x - lo + _MINMAX_EPS) / (hi - lo), torch.ones_like(x))


def quality(r: torch.Tensor, theta: float) -> torch.Tensor:
    """Per-token kernel weight q (N_V,): exp(alpha r) with alpha = theta / (2(1 - theta)); r at theta = 1."""
    if theta == 1.0:
        return r  # the released kernel diag(r) S diag(r)
    alpha = theta / (2.0 * (1.0 - theta))
    return torch.exp(alpha * r)


def greedy_map(kernel_rows, diag: torch.Tensor, k: int, fallback: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy MAP of the DPP with kernel L, by incremental Cholesky (Chen et al. 2018, Alg. 1).

    kernel_rows(idx) -> L[idx, :] (m, N) for idx (m,) int64 on the device; diag: L_ii (N,); k picks;
    fallback (N,): the priority for the picks left once the kernel's rank is exhausted. Returns
    (order (k,), scores (N,)): a picked token's d^2 when picked, an unpicked token's d^2 given the
    final set. Every step stays on the device: a picked token's d^2 is set to -inf (no Python set),
    and whether the rank is exhausted is a device flag that selects between the Cholesky pick and
    the fallback pick and zeroes the update (no host copy per token).
    """
    n, dev = diag.shape[0], diag.device
    # rows: d_i^2 = det(L_{S+i}) / det(L_S), and the fallback priority; -inf in both once picked (one fill)
    state = torch.stack([diag.to(torch.float32), fallback.to(torch.float32)])  # (2, N)
    d2 = state[:1]  # (1, N) a view: updated in place
    c = torch.zeros(k, n, device=dev)  # (K, N) row s holds e_i of step s; c_i is the column c[:s, i]
    floor = _EPS * diag.max().clamp_min(0.0)  # 0-dim, on the device
    exhausted = torch.zeros(1, dtype=torch.bool, device=dev)  # sticky: once no token adds volume
    picks, gains = [], []
    for step in range(k):
        best, top = state.max(dim=1)  # (2,), (2,): the best d^2 and the best fallback; ties to the lowest index
        exhausted = exhausted | (best[:1] <= floor)
        j = top.gather(0, exhausted.long())  # (1,) the Cholesky pick, or the fallback's once exhausted
        dj2 = d2.index_select(1, j)  # (1, 1)
        state.index_fill_(1, j, -math.inf)
        picks.append(j)
        gains.append(dj2)
        # e_i = (L_ji - <c_j, c_i>) / d_j for every i, written into row `step` of c; e = 0 once exhausted
        prev = c[:step]  # (step, N)
        e = torch.addmm(kernel_rows(j), prev.index_select(1, j).T, prev, alpha=-1)  # (1, N)
        e = torch.div(e, dj2.clamp_min(_TINY).sqrt(), out=c[step:step + 1]).masked_fill_(exhausted, 0.0)
        d2.sub_(e * e)  # stays -inf where picked
    order = torch.cat(picks)  # (K,)
    scores = d2[0].clone()  # unpicked: d^2 given the final set
    scores.index_copy_(0, order, torch.cat(gains)[:, 0])
    return order, scores.clamp_min(0.0)


# capture: one graph; not batched (its greedy writes into its own state in place, which torch.vmap cannot batch)
@register_pruner("cdpruner", needs=("text",), capture=Capturable(batch=False), label="CDPruner",
                 score_label="DPP gain d² (kernel units)", params=(
    Param.real("theta", 1.0, 0.0, 1.0, "relevance weight of the kernel (1 = the released kernel; < 1: later "
               "ports' exp weighting)", step=0.05),))
def cdpruner(visual: torch.Tensor, text: torch.Tensor, budget: int, *,
             theta: float = 1.0,  # the released kernel diag(r) S diag(r); < 1: later ports' weighting
             ) -> Selection:
    """CDPruner: greedy MAP of a DPP whose kernel weighs visual similarity by prompt relevance."""
    r = relevance(visual, text)  # (N_V,)
    q = quality(r, theta)  # (N_V,)
    cos = CosineColumns(visual)  # S, dense up to mi.DENSE_LIMIT

    if cos.dense:  # L held whole: one row read a step
        kernel = q[:, None] * q[None, :] * cos.cos  # (N_V, N_V) L = diag(q) S diag(q)

        def kernel_rows(idx: torch.Tensor) -> torch.Tensor:
            return kernel.index_select(0, idx)
    else:
        def kernel_rows(idx: torch.Tensor) -> torch.Tensor:  # L[idx, :] = q_j q_i S_ji, (m, N_V)
            return q.index_select(0, idx)[:, None] * q[None, :] * cos.cols(idx)

    diag = q * q * (cos.u * cos.u).sum(dim=1)  # (N_V,) L_ii = q_i^2 (0 for a zero-norm row)
    order, scores = greedy_map(kernel_rows, diag, budget, fallback=q)
    return Selection.from_order(order, scores, extras={"relevance": r, "quality": q})
