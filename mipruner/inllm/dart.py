"""DART (Wen et al., 2025, "Stop looking for important tokens ... duplication matters more").

Rule, at decoder layer K (original K = 2):
  1. pivots: the `image_pivots` image tokens and the `text_pivots` text tokens with the largest L1
     norm of their layer K-1 keys (heads concatenated). Text candidates are the tokens after the
     last image token (the question and the answer prompt), as in the original. Original: 4 + 4.
  2. for each pivot in turn, the remaining image tokens LEAST similar to it (cosine of the hidden
     states entering layer K, after the model's final norm as in the original) join the kept set
     and leave the pool.
  3. kept = image pivots + the picks.

Budget: the original gives every pivot floor(budget / n_pivots) picks on top of the image pivots,
so it keeps a few tokens more or less than asked. Here exactly `budget` image tokens are kept: the
image pivots count towards the budget (at most `budget` of them), and the remaining
budget - n_image_pivots picks are shared out as evenly as possible (the first pivots in order get
one more). Pivots are visited image pivots first, then text pivots, each by descending key norm
(the original walks a Python set, whose order is an implementation detail). Ties go to the lower
index everywhere.
"""
from __future__ import annotations

import torch

from ..pruners._registry import Param, register_pruner
from ..pruners.selection import Selection, unit_rows
from ._run import answer, prepare
from .fastv import LAYER


def _top(values: torch.Tensor, k: int) -> torch.Tensor:
    return torch.sort(values, descending=True, stable=True).indices[:k]


def dart_rank(key_l1_image: torch.Tensor, key_l1_text: torch.Tensor, hidden_image: torch.Tensor,
              hidden_text: torch.Tensor, budget: int, image_pivots: int = 4, text_pivots: int = 4) -> Selection:
    """DART's kept set over N_V image tokens (see module doc).

    key_l1_image (N_V,), key_l1_text (N_T,): L1 norms of the layer K-1 keys; hidden_image (N_V, d),
    hidden_text (N_T, d): normed hidden states entering layer K. Returns a Selection with
    order = image pivots, then each pivot's picks; scores (N_V,) = -cos to the pivot that picked
    the token (its "uniqueness" at that step), 1.0 for image pivots, and for tokens never picked
    -max cos to any pivot; extras: pivots_image (indices into N_V), pivots_text (indices into N_T),
    picked_by (N_V,) index into the pivot list (-1: not picked, image pivots their own slot).
    """
    n_v = key_l1_image.shape[0]
    p_img = min(image_pivots, budget)
    img_piv = _top(key_l1_image.float().cpu(), p_img)  # (P_i,)
    txt_piv = _top(key_l1_text.float().cpu(), min(text_pivots, key_l1_text.shape[0]))  # (P_t,)
    v = unit_rows(hidden_image.detach().cpu())  # (N_V, d)
    t = unit_rows(hidden_text.detach().cpu())  # (N_T, d)
    pivots = torch.cat([v[img_piv], t[txt_piv]])  # (P, d): image pivots first, then text pivots
    n_piv = pivots.shape[0]
    rest = budget - p_img
    if rest > 0 and n_piv == 0:
        raise ValueError("DART has no pivots: set image_pivots or text_pivots >= 1")
    cos = v @ pivots.T  # (N_V, P)
    scores = -cos.max(dim=1).values if n_piv else torch.zeros(n_v)
    picked_by = torch.full((n_v,), -1, dtype=torch.long)
    pool = torch.ones(n_v, dtype=torch.bool)
    pool[img_piv] = False
    scores[img_piv] = 1.0
    picked_by[img_piv] = torch.arange(p_img)
    order = [img_piv]
    for j in range(n_piv if rest > 0 else 0):
        quota = rest // n_piv + (1 if j < rest % n_piv else 0)
        if quota == 0:
            continue
        gain = torch.where(pool, -cos[:, j], torch.tensor(-float("inf")))  # least similar first
        pick = _top(gain, quota)
        scores[pick] = gain[pick]
        picked_by[pick] = j
        pool[pick] = False
        order.append(pick)
    sel = Selection.from_order(torch.cat(order), scores)
    sel.extras.update(pivots_image=img_piv, pivots_text=txt_piv, picked_by=picked_by)
    return sel


def _dart_hidden(prompt, prefix, cache: dict | None) -> dict:
    """Normed (final norm) hidden states entering layer K: image rows and text-candidate rows."""
    key = ("dart_hidden", prefix.layer)
    if cache is not None and key in cache:
        return cache[key]
    vis = prompt.visual_positions
    after = torch.arange(int(vis.max()) + 1, prompt.length, device=vis.device)  # tokens after the last image token
    normed = prompt.lm.norm(prefix.hidden)[0]  # (L, d)
    out = {"image": normed[vis].float(), "text": normed[after].float(), "text_positions": after}
    if cache is not None:
        cache[key] = out
    return out


@register_pruner("dart", stage="llm", needs=("adapter",), label="DART", answer=answer,
                 score_label="-cosine to its pivot", params=(
    LAYER,
    Param.integer("image_pivots", 4, 0, None, "image pivot tokens, by L1 norm of layer K-1 keys (DART: 4)"),
    Param.integer("text_pivots", 4, 0, None, "text pivot tokens, from the tokens after the last image token "
                  "(DART: 4)")))
@torch.no_grad()
def dart(adapter, encoded, budget, *, cache: dict | None = None, layer: int = 2, image_pivots: int = 4,
         text_pivots: int = 4) -> Selection:
    """DART: pivot tokens by key norm, then the image tokens least similar to each pivot."""
    if image_pivots + text_pivots < 1:
        raise ValueError("image_pivots + text_pivots must be >= 1, got 0")
    prompt, layer, k, prefix = prepare(adapter, encoded, budget, layer, cache)
    vis = prompt.visual_positions
    hidden = _dart_hidden(prompt, prefix, cache)
    sel = dart_rank(prefix.key_l1[vis], prefix.key_l1[hidden["text_positions"]], hidden["image"],
                    hidden["text"], k, image_pivots, text_pivots)
    sel.extras["pivots_text_positions"] = hidden["text_positions"][sel.extras["pivots_text"].to(vis.device)].cpu()
    sel.extras.update(image_pivots=image_pivots, text_pivots=text_pivots, layer=layer)
    return sel
