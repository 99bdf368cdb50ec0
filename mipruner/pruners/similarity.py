"""Similarity: rank visual tokens by their cosine with the prompt (the paper's "Similarity" baseline).

    v~, t~            L2-normalised rows of V (N_V, d) and T (N_T, d)
    cos = v~ t~^T     (N_V, N_T)
    s_i = max_m cos(i, m)   ("max")   or   mean_m cos(i, m)   ("mean")
    keep the K tokens of highest s_i   (ties to the lowest index)

This is the paper's Eq. 6 without the softmax / PMI: the raw cross-modal cosine, so the comparison
with MI-Pruner isolates what the PMI normalisation adds. Rows of zero norm have cosine 0.

Original: the MI-Pruner paper's "Similarity" baseline ("cosine similarity between V/T tokens",
Eq. 6); no code was released for it. Our reading (deliberate): aggregate over the prompt tokens by
max by default, as MI-Pruner's default, with "mean" as the option; the prompt tokens are the question
(`text_mode`), as for MI-Pruner; ties to the lowest index.
"""
from __future__ import annotations

import torch

from ._registry import register_pruner
from .capture import Capturable
from .mi import AGGREGATION
from .selection import Selection, cosine_to



@register_pruner("similarity", needs=("text",), capture=Capturable(), params=(AGGREGATION,), label="Similarity",
                 score_label="cosine with the prompt")
def similarity_pruner(visual: torch.Tensor, text: torch.Tensor, budget: int, *,
                      aggregation: str = "max",  # same default as MI-Pruner, so the two compare 1:1
                      ) -> Selection:
    """Similarity: keep the visual tokens with the highest cosine to the prompt."""
    cos = cosine_to(visual, text)  # (N_V, N_T)
    score = cos.max(dim=1).values if aggregation == "max" else cos.mean(dim=1)  # (N_V,)
    order = torch.argsort(score, descending=True, stable=True)[:budget]  # (K,), ties to lowest index
    return Selection.from_order(order, score, extras={"cosine": cos})
