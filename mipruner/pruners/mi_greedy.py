"""MI-Pruner's greedy step (paper Alg. 1, lines 4-8), shared by `mi`, `mi_attention` and `mi_adaptive`:
`greedy_select` picks k tokens maximising S_i = lam * S_cross_i - (1 - lam) * S_self_i, the redundancy
S_self kept by `Redundancy` one pick at a time ("max": `_greedy_max`, three kernels a step). The PMI
tables it reads are `mipruner.pruners.mi`'s: every `self_pmi` below is a `mi.SelfPMI` (not imported here,
as `mi` imports this module); see that module's docstring for the formulas.
Everything runs on the inputs' device; a step is a few (N_V,) kernels and no host copy.
"""
from __future__ import annotations

import math

import torch


class Redundancy:
    """S_self_i = agg_{j in kept} (every candidate i at once, (1, N_V)), grown one pick at a time.

    "max": max_j PMI_self(i, j). "mean" + mean_weights "all": sum_j p(v_j|v_i) PMI_self(i, j) with
    p normalised over all N_V tokens (Eq. 7, as written). "mean" + "kept": the same average with
    the weights renormalised over the kept set, p(v_j|v_i) / sum_{k in kept} p(v_k|v_i), i.e.
    softmax over the kept set; kept as running (max, sum of weights, weighted sum) in log space so
    that weights far below float32's range (small tau) never divide 0 by 0.
    `value` is 0 while nothing is kept. Everything stays on the inputs' device.
    """

    def __init__(self, self_pmi, aggregation: str, mean_weights: str, n: int, device: torch.device):
        self.sp, self.aggregation = self_pmi, aggregation
        self.kept_weights = aggregation == "mean" and mean_weights == "kept"
        self.value = torch.zeros(1, n, device=device)  # 0 while nothing is kept
        self.empty = True

    def add(self, idx: torch.Tensor) -> None:
        """Add the tokens idx (m,) to the kept set."""
        if not self.kept_weights:
            t = self.sp.rows(idx, self.aggregation)  # (m, N_V)
            if self.aggregation == "max":
                t = t if t.shape[0] == 1 else t.amax(dim=0, keepdim=True)
                self.value = t if self.empty else torch.maximum(self.value, t)
            else:
                t = t if t.shape[0] == 1 else t.sum(dim=0, keepdim=True)
                self.value = t if self.empty else self.value + t
        else:
            pmi = self.sp.rows(idx, "max")  # (m, N_V)
            log_w = pmi - self.sp.log_n  # log p(v_j|v_i) (any per-row constant cancels)
            top = log_w.amax(dim=0, keepdim=True)  # (1, N_V)
            if not self.empty:
                top = torch.maximum(self.top, top)
            w = torch.exp(log_w - top)  # (m, N_V) in (0, 1]
            den, num = w.sum(dim=0, keepdim=True), (w * pmi).sum(dim=0, keepdim=True)
            if not self.empty:
                scale = torch.exp(self.top - top)
                den, num = self.den * scale + den, self.num * scale + num
            self.top, self.den, self.num = top, den, num
            self.value = num / den  # den >= 1: the largest weight is exp(0)
        self.empty = False


def greedy_select(relevance: torch.Tensor, self_pmi, k: int, lam: float,
                  aggregation: str = "max", init: torch.Tensor | None = None, mean_weights: str = "all"
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Alg. 1's greedy: pick argmax S_i = lam*S_cross_i - (1-lam)*S_self_i, k times.

    `init`: indices already selected (MI-Attention's round 1); they seed the redundancy term and
    are not returned. Returns (order (k,), scores (N_V,), redundancy (N_V,)); a picked token's
    score is its gain when picked, an `init` token's lam * S_cross, the others' their gain given
    the final selected set.
    Ties go to the lowest index (torch.max returns the first maximum).
    One step is a handful of (N_V,) kernels on the inputs' device: no host copy, no Python set;
    a picked token leaves the race by setting its lam * S_cross to -inf.
    """
    if aggregation == "max":
        return _greedy_max(relevance, self_pmi, k, lam, init)
    n, dev = relevance.shape[0], relevance.device
    c = 1.0 - lam
    base = (lam * relevance).reshape(1, n)  # (1, N_V); picked tokens are set to -inf
    scores = base.clone()[0]  # `init` tokens keep lam * S_cross, their gain with nothing selected
    red = Redundancy(self_pmi, aggregation, mean_weights, n, dev)
    if init is not None and init.numel():
        init = init.to(device=dev, dtype=torch.long)
        red.add(init)
        base.index_fill_(1, init, -math.inf)
    order = torch.empty(k, dtype=torch.long, device=dev)
    gains = torch.empty(k, device=dev)  # each pick's gain when picked
    order2, gains2 = order.view(k, 1), gains.view(k, 1)
    for step in range(k):
        gain = base if red.empty else base - c * red.value  # (1, N_V)
        torch.max(gain, 1, keepdim=True, out=(gains2[step:step + 1], order2[step:step + 1]))
        j = order[step:step + 1]  # (1,), stays on the device
        base.index_fill_(1, j, -math.inf)
        red.add(j)
    taken = torch.isneginf(base[0])  # picked or `init`
    scores = torch.where(taken, scores, (base - c * red.value)[0])  # the others: gain given the final set
    scores.index_copy_(0, order, gains)
    return order, scores, red.value[0]


def _greedy_max(relevance: torch.Tensor, self_pmi, k: int, lam: float, init: torch.Tensor | None
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`greedy_select` for aggregation "max", three kernels a step (max, one row read, minimum).

    With G[j, i] = lam S_cross_i - (1 - lam) PMI_self(i, j) (G[j, j] = -inf: a kept token leaves the
    race), the gain given the kept set S is S_i = min_{j in S} G[j, i]: x -> a - c x (c >= 0) is
    non-increasing also in float32 (each rounding is monotone), so min_j fl(a - fl(c R_j)) is exactly
    fl(a - fl(c max_j R_j)), the gain the textbook loop computes; same bits, same picks, same ties.
    G is built once (N_V^2) when the self-PMI is held dense, else one row a step (O(N_V d)).
    """
    n, dev = relevance.shape[0], relevance.device
    c = 1.0 - lam
    base = lam * relevance  # (N_V,) the gain with nothing kept
    table = self_pmi.table("max")  # (N_V, N_V) R[j, i] = PMI_self(i, j), or None above DENSE_LIMIT
    if table is not None:
        g_all = base[None, :] - c * table  # (N_V, N_V) G
        g_all.diagonal().fill_(-math.inf)  # a view's fill: batched by torch.vmap (fill_diagonal_ is not)

        def gain_rows(idx: torch.Tensor) -> torch.Tensor:
            return g_all.index_select(0, idx)  # (m, N_V)
    else:
        seen = []  # the PMI_self rows read, for the redundancy (the same products as the textbook loop's)

        def gain_rows(idx: torch.Tensor) -> torch.Tensor:  # (m, N_V), G's rows recomputed
            seen.append(self_pmi.rows(idx, "max"))
            return (base[None, :] - c * seen[-1]).scatter_(1, idx[:, None], -math.inf)

    if init is not None and init.numel():
        init = init.to(device=dev, dtype=torch.long)
        gain = gain_rows(init).amin(dim=0, keepdim=True)  # (1, N_V)
    else:
        init, gain = None, base.reshape(1, n)
    picks, gains = [], []
    for step in range(k):
        best, j = torch.max(gain, 1)  # (1,), (1,): ties to the lowest index; stays on the device
        picks.append(j)
        gains.append(best)
        row = gain_rows(j)  # (1, N_V)
        gain = row if (step == 0 and init is None) else torch.minimum(gain, row)
    order = torch.cat(picks)  # (k,)
    kept = order if init is None else torch.cat([init, order])
    rows = table.index_select(0, kept) if table is not None else torch.cat(seen)  # (|kept| (+1), N_V)
    redundancy = rows.amax(dim=0)  # (N_V,) max_{j in kept} PMI_self(i, j)
    scores = torch.where(torch.isneginf(gain[0]), base, gain[0])  # unpicked: gain given the final set
    scores = scores.scatter(0, order, torch.cat(gains))  # picked: gain when picked; `init`: lam * S_cross
    return order, scores, redundancy
