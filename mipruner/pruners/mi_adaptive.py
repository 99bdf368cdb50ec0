"""MI-Pruner with a per-input budget: the paper's "dynamic budget" future work (App. C), our design.

The paper fixes K per benchmark and names choosing K per input as future work. This method runs
MI-Pruner's greedy (Alg. 1, `mipruner.pruners.mi`) with the budget as the most it may keep, and
stops earlier by one of two rules (`k_rule`):

  "gain"  stop before the first pick whose marginal gain S_i = lam S_cross_i - (1-lam) S_self_i
          falls below gain_ratio x the largest gain so far: the prompt-relevant, not yet covered
          content is exhausted. With lam = 1 the gains are S_cross in decreasing order, so this is
          the first pick's gain. With lam < 1 it is not: the first pick has no redundancy term,
          and S_self = max_j PMI_self(i, j) is negative for a patch unlike every kept one, so the
          second pick's gain usually exceeds the first's (a diversity bonus).
  "mass"  keep the fewest picks (in greedy order) whose relevance S_cross (floored at 0) holds
          mass_share of the whole image's: sum_{kept} S_cross^+ >= mass_share sum_i S_cross^+.
          S_cross^+ is the "cross-modal PMI mass" (max_j PMI >= 0 for softmax PMI: KL >= 0).
  "fixed" keep exactly the budget (MI-Pruner itself; the default, so the method honours the
          registry's budget contract until a rule is chosen).

At least one token is always kept. K is a property of the input: the same prompt keeps few
tokens on an image where the asked object is small and clear, more where it is large or the
prompt is open. `sel.budget` is the chosen K; `extras["gains"]` holds the gain of every pick up
to the budget (so a UI can draw where it stopped) and `extras["k_rule"]` the rule.
"""
from __future__ import annotations

import torch

from ._registry import Param, register_pruner
from .capture import Capturable
from .lam_rule import LAM_RULE
from .mi import MI_PARAMS, SelfPMI, _cached, cross_pmi, greedy_select
from .selection import Selection, top_indices

K_RULES = ("fixed", "gain", "mass")
K_RULE = Param.choice("k_rule", "fixed", K_RULES, "how many tokens (budget = the most): fixed = the budget; "
                      "gain = stop when the marginal gain falls below gain_ratio x the best so far; mass = "
                      "the fewest holding mass_share of the cross-modal PMI mass", code="kr")
GAIN_RATIO = Param.real("gain_ratio", 0.5, 0.0, 1.0, "k_rule gain: stop below this share of the largest gain so far",
                        low_open=True, code="gr", step=0.05)
MASS_SHARE = Param.real("mass_share", 0.5, 0.0, 1.0, "k_rule mass: keep this share of the cross-modal PMI mass",
                        low_open=True, code="ms", step=0.05)


def stop_index(gains: torch.Tensor, relevance: torch.Tensor, order: torch.Tensor, k_rule: str,
               gain_ratio: float, mass_share: float) -> int:
    """How many of the picks `order` (with their `gains`) to keep under `k_rule`; at least 1.

    gains, order: (K_max,) in pick order; relevance: (N_V,) S_cross of every token.
    """
    k_max = int(order.numel())
    if k_rule == "fixed":
        return k_max
    if k_rule == "gain":
        peak = torch.cummax(gains, dim=0).values  # (K_max,) the largest gain up to each pick
        below = gains[1:] < gain_ratio * peak[:-1]  # (K_max - 1,) pick t+1 against the picks before it
        hit = torch.nonzero(below).flatten()
        return int(hit[0]) + 1 if hit.numel() else k_max
    mass = relevance.clamp_min(0.0)  # (N_V,)
    total = mass.sum()
    cum = torch.cumsum(mass[order], dim=0)  # (K_max,) mass held by the first t+1 picks
    reached = torch.nonzero(cum >= mass_share * total).flatten()
    return int(reached[0]) + 1 if reached.numel() else k_max


def _fixed_k(n_v: int, params: dict) -> bool:
    """Capturable only with k_rule "fixed": the other rules read the chosen K on the host (after the greedy)."""
    return params["k_rule"] == "fixed"


@register_pruner("mi_adaptive", needs=("text",), capture=Capturable(when=_fixed_k),
                 params=(*MI_PARAMS, LAM_RULE, K_RULE, GAIN_RATIO, MASS_SHARE),
                 label="MI-Pruner (adaptive K)", is_mi=True, score_label="greedy MI gain (nats)", adaptive=True)
def mi_adaptive_pruner(visual: torch.Tensor, text: torch.Tensor, budget: int, *,
                       lam: float = 0.5,  # as `mi`: paper Sec. 4.1, 0.5 open-ended, 1 closed-form
                       tau: float = 0.1,  # as `mi`: paper Tab. 4
                       aggregation: str = "max",  # as `mi`: paper Fig. 5a
                       normalization: str = "softmax",  # as `mi`: paper App. B.2
                       mean_weights: str = "all",  # as `mi`: left open by the paper; "all" = Eq. 7
                       lam_rule: str = "auto",  # as `mi`: applied by mipruner.select from the prompt
                       k_rule: str = "fixed",  # fixed: exactly the budget (the registry's contract)
                       gain_ratio: float = 0.5,  # ours: not in the paper
                       mass_share: float = 0.5,  # ours: not in the paper
                       cache: dict | None = None) -> Selection:
    """MI-Pruner choosing K per input: stop when the gain drops or the PMI mass is covered."""
    cross = _cached(cache, visual, text, ("cross", tau, normalization),
                    lambda: cross_pmi(visual, text, tau, normalization))
    relevance = cross.relevance(aggregation)  # (N_V,)
    extras = {"relevance": relevance, "k_rule": k_rule}
    if lam == 1.0:
        order = top_indices(relevance, budget)  # gains are S_cross itself, in decreasing order; ties to the lowest index
        gains, scores = relevance[order], relevance
    else:
        self_pmi = _cached(cache, visual, text, ("self", tau, normalization),
                           lambda: SelfPMI(visual, tau, normalization))
        order, scores, extras["redundancy"] = greedy_select(relevance, self_pmi, budget, lam, aggregation,
                                                            mean_weights=mean_weights)
        gains = scores[order]  # (budget,) each pick's gain when it was picked
    k = stop_index(gains, relevance, order, k_rule, gain_ratio, mass_share)
    extras["gains"] = gains
    return Selection.from_order(order[:k], scores, pmi=cross.pmi, pivot=cross.pivot, extras=extras)


__all__ = ["GAIN_RATIO", "K_RULE", "K_RULES", "MASS_SHARE", "mi_adaptive_pruner", "stop_index"]
