"""MI-Attention (paper Sec. 4, "round-1 / round-2"): vision-encoder attention first, then MI-Pruner fills up.

    round 1: K1 = round(split * K) tokens with the highest Attn_i (attention.py's score, Eq. 1:
             A[cls, 1+i], or sum_{j != i} A[j, i] without [CLS])
    round 2: the other K - K1 tokens by MI-Pruner's greedy (Alg. 1) over the tokens not kept in
             round 1, with the round-1 tokens already in the selected set, so they seed the
             redundancy term:  S_i = lam S_cross_i - (1 - lam) agg_{j in selected} PMI_self(i,j)
             lam == 1: a plain top-K of S_cross over the remaining tokens (no N_V x N_V work).
    split = 1 is the `attention` pruner; split = 0 is `mi` with the same parameters.

All MI work is mipruner.pruners.mi's (`cross_pmi`, `SelfPMI`, `greedy_select(init=...)`), and
`cache=` holds the same entries as for `prune("mi", ...)`, so one dict serves both methods.
The paper does not state the split; 0.5 is our default. `mean_weights` is `mi`'s (see mi.py): with
"kept", the round-1 tokens belong to the kept set over which the weights are renormalised. Attn is
moved to `visual`'s device (the adapters keep attention on the host), where the Selection lives.
"""
from __future__ import annotations

import math

import torch

from ._registry import Param, register_pruner
from .capture import Capturable
from .attention import attention_scores
from .lam_rule import LAM_RULE
from .mi import MI_PARAMS, SelfPMI, _cached, cross_pmi, greedy_select
from .selection import Selection, top_indices


@register_pruner("mi_attention", stage="vision", capture=Capturable(), needs=("text", "attention"),
                 label="MI-Pruner + attention",
                 score_label="greedy MI gain (nats)",
                 is_mi=True, params=(Param.real("split", 0.5, 0.0, 1.0, "share of the budget kept by vision-encoder "
                                                "attention in round 1 (the rest by MI)", step=0.05), *MI_PARAMS, LAM_RULE))
def mi_attention_pruner(visual: torch.Tensor, text: torch.Tensor, budget: int, *,
                        attention: torch.Tensor | None = None,
                        keys: torch.Tensor | None = None,  # unused; every attention pruner takes the same inputs
                        split: float = 0.5,  # share of the budget kept by attention in round 1 (not in the paper)
                        lam: float = 0.5,  # as `mi`: paper Sec. 4.4, 0.5 open-ended, 1 closed-form
                        tau: float = 0.1,  # as `mi`: paper Tab. 4, best of {0.01, 0.1, 0.5}
                        aggregation: str = "max",  # as `mi`: paper Fig. 5a, max beats mean
                        normalization: str = "softmax",  # as `mi`: paper App. B.2, softmax beats MinMax
                        mean_weights: str = "all",  # as `mi`: left open by the paper; "all" = Eq. 7
                        lam_rule: str = "auto",  # as `mi`: applied by mipruner.select from the prompt
                        cache: dict | None = None) -> Selection:
    """MI-Attention: round 1 keeps tokens by vision-encoder attention, round 2 fills the rest by MI."""
    n_v = visual.shape[0]
    attn = attention_scores(attention, n_v, method="mi_attention").to(visual.device)  # (N_V,)
    cross = _cached(cache, visual, text, ("cross", tau, normalization),
                    lambda: cross_pmi(visual, text, tau, normalization))
    relevance = cross.relevance(aggregation)  # (N_V,)

    k1 = min(budget, int(math.floor(split * budget + 0.5)))  # K1 = round(split K)
    round1 = top_indices(attn, k1)  # (K1,) highest attention first (ties to the lowest index), on the inputs' device
    k2 = budget - k1
    extras = {"relevance": relevance, "attention": attn}
    if lam == 1.0 or k2 == 0:
        scores = lam * relevance  # (N_V,) lam == 1: S_cross itself, as in `mi`; K2 == 0: no round 2 to score
        round2 = top_indices(relevance.index_fill(0, round1, -math.inf), k2)  # (K2,)
    else:
        self_pmi = _cached(cache, visual, text, ("self", tau, normalization),
                           lambda: SelfPMI(visual, tau, normalization))
        round2, scores, extras["redundancy"] = greedy_select(relevance, self_pmi, k2, lam, aggregation,
                                                             init=round1, mean_weights=mean_weights)
        scores[round1] = lam * relevance[round1]  # round-1 tokens: their gain before any redundancy
    rounds = torch.zeros(n_v, dtype=torch.long, device=visual.device)  # (N_V,) round a token came in; 0: pruned
    rounds = rounds.index_fill(0, round1, 1).index_fill(0, round2, 2)  # no host scalar copied (capturable); vmap-able
    extras["round"] = rounds
    order = torch.cat([round1, round2])  # (K,)
    return Selection.from_order(order, scores, pmi=cross.pmi, pivot=cross.pivot, extras=extras)
