"""VisionZip (Yang et al. 2025): dominant tokens by [CLS] attention, the rest merged into contextual tokens.

    dominant:   D = round(dominant_ratio * K) tokens with the highest Attn_i (attention.py's score:
                A[cls, 1+i], or sum_{j != i} A[j, i] when the encoder has no [CLS])
    contextual: the other tokens R (index order) and their keys k~ (head-averaged, L2-normalised);
                C = K - D targets at positions 0, s, 2s, ... of R with stride s = floor(|R| / C);
                every other token r of R goes to its most similar target argmax_t cos(k~_r, k~_t);
                token_t := v_t + mean_{r -> t} v_r      (v_t unchanged when nothing is assigned)
    keep = dominant + targets; Selection.tokens = the K replacement rows in `keep` order, computed in
    float32 and returned in `visual`'s dtype (they replace its rows in the LLM input).

Deviations from the original, and why:
  * The original merges the vision encoder's hidden states before the projector. The LLM consumes
    projected tokens and pruners here only see those, so we merge rows of `visual` (the projected
    tokens) with the same assignment. The projector is not linear (LLaVA's MLP has a GELU), so a
    merged row differs from projecting a merged hidden state; dominant rows are identical.
  * The original also keeps [CLS]'s own token; `visual` has no [CLS] row, so K counts visual
    tokens only.
  * The original fixes 64 = 54 dominant + 10 contextual; here the split scales with K
    (D = round(54/64 K)), keeping at least one contextual token whenever K >= 2.
  * On Qwen2.5-VL the original averages column-sum attention over each 2x2 merge group; the model
    adapter does that before calling, so `attention` is already at the N_V-token granularity.
Cost: O(N_V log N_V) for the dominant top-K plus O(|R| C d_k) for the assignment.
"""
from __future__ import annotations

import math

import torch

from ._registry import Param, register_pruner
from .attention import attention_scores, image_keys
from .selection import Selection, check_range, unit_rows


def dominant_count(budget: int, ratio: float) -> int:
    """D = round(ratio * K) (half up), leaving at least one contextual token when K >= 2."""
    d = int(math.floor(ratio * budget + 0.5))
    return min(d, budget - 1) if budget >= 2 else min(d, budget)


@register_pruner("visionzip", stage="vision", needs=("attention", "keys"), label="VisionZip",
                 score_label="attention share", params=(
    Param.real("dominant_ratio", 54 / 64, 0.0, 1.0, "share of the budget kept as dominant tokens (original: 54 of 64)",
               code="dom", step=0.01),))
def visionzip_pruner(visual: torch.Tensor, text: torch.Tensor | None, budget: int, *,
              attention: torch.Tensor | None = None,
              keys: torch.Tensor | None = None,
              dominant_ratio: float = 54 / 64,  # original: 64 tokens = 54 dominant + 10 contextual
              ) -> Selection:
    """VisionZip: keep the top tokens by [CLS] attention and merge the rest into a few contextual ones."""
    ratio = check_range("dominant_ratio", dominant_ratio, 0.0, 1.0)
    n_v = visual.shape[0]
    attn = attention_scores(attention, n_v, method="visionzip")  # (N_V,)
    k_img = image_keys(keys, attention, n_v, method="visionzip")  # (N_V, d_k)
    n_dom = dominant_count(budget, ratio)
    n_ctx = budget - n_dom
    dominant = torch.topk(attn, n_dom).indices.cpu()  # (D,) highest attention first
    rest_mask = torch.ones(n_v, dtype=torch.bool)
    rest_mask[dominant] = False
    rest = torch.nonzero(rest_mask).flatten()  # (N_V - D,) ascending

    v = visual.to(torch.float32)
    merged_into = torch.arange(n_v)  # (N_V,) the kept token each token ends up in
    targets = rest[:0]
    delta = v[:0]  # (C, d) what merging adds to each target
    if n_ctx > 0:
        stride = rest.numel() // n_ctx  # >= 1 since |R| = N_V - D >= K - D = C
        slots = torch.arange(0, rest.numel(), stride)[:n_ctx]  # (C,) uniform stride over R
        is_target = torch.zeros(rest.numel(), dtype=torch.bool)
        is_target[slots] = True
        targets, others = rest[slots], rest[~is_target]  # (C,), (|R| - C,)
        delta = v.new_zeros(n_ctx, v.shape[1])  # (C, d)
        if others.numel() > 0:
            u = unit_rows(k_img)  # (N_V, d_k), zero rows stay zero
            assign = (u[others] @ u[targets].T).argmax(dim=1).cpu()  # (|R| - C,) most similar target slot
            sums = delta.index_add(0, assign.to(v.device), v[others])  # (C, d) sum of assigned rows
            counts = torch.bincount(assign, minlength=n_ctx).clamp_min(1).to(v.device)  # (C,)
            delta = sums / counts[:, None].to(torch.float32)  # (C, d) mean of assigned rows (0 if none)
            merged_into[others] = targets[assign]

    order = torch.cat([dominant, targets])  # (K,) dominant by attention, then targets in stride order
    keep, _ = torch.sort(order)
    tokens = v[keep]  # (K, d)
    tokens[torch.searchsorted(keep, targets)] += delta  # contextual rows := target + mean(assigned)
    return Selection.from_order(order, attn, tokens=tokens.to(visual.dtype),
                                extras={"merged_into": merged_into, "dominant": dominant})
