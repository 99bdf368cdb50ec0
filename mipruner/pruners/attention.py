"""Attention: keep the visual tokens the vision encoder attends to most (the paper's Eq. 1).

Original: the MI-Pruner paper's "Attention" baseline, which it takes from VisionZip's dominant-token
step (dvlab-research/VisionZip, `visionzip/clip_encoder.py` `CLIPVisionTower_VisionZip.forward`:
top-K of [CLS] attention at the tower's feature layer, summed over heads) and, for encoders without a
[CLS] (Qwen), defines as the attention summed over the other image tokens. No code of its own was
released. Deviations: the head MEAN instead of the head sum (same ranking); no [CLS] token is kept
(VisionZip itself keeps it: `visionzip`); ties to the lowest index on every device (a stable sort).

    with a [CLS] token:   Attn_i = A[cls, 1+i]                  (what [CLS] reads from patch i)
    without one:          Attn_i = sum_{j != i} A[j, i]         (column sum over image queries,
                                                                 the diagonal excluded)
    keep the top-K of Attn.

Input convention, shared by every encoder-attention pruner (visionzip, vispruner, mi_attention):
`attention` holds the encoder's head-averaged attention PROBABILITIES of one layer, rows = queries,
cols = keys, shape (N_V+1, N_V+1) with [CLS] first when the encoder has one, else (N_V, N_V).
Whether [CLS] is present is read from the shape; `keys` (N_V[+1], d_k) are the same layer's
head-averaged keys, in the same row order. Geometry (Qwen's 2x2 merge groups, tiles, frames) is
the model adapter's job: it hands over attention at the granularity of the N_V projected tokens.
Attention may arrive on another device than `visual` (adapters keep it on the host): Attn (N_V,) is
computed where the attention is and moved to `visual`'s device, where the Selection lives.
"""
from __future__ import annotations

import torch

from ._registry import Param, register_pruner
from .capture import Capturable
from .selection import Selection, check_matrix, top_indices


def has_cls(attention: torch.Tensor | None, n_v: int, *, method: str) -> bool:
    """Validate `attention` for `n_v` visual tokens; True when row/col 0 is [CLS].

    Raises ValueError when it is missing, not a finite float matrix, or not (N_V+1, N_V+1) / (N_V, N_V).
    """
    if attention is None:
        raise ValueError(f"{method!r} needs attention=(N_V+1, N_V+1) (with [CLS]) or (N_V, N_V) "
                         "head-averaged vision-encoder attention probabilities; got None")
    check_matrix("attention", attention)
    rows, cols = attention.shape
    if rows != cols or rows not in (n_v, n_v + 1):
        raise ValueError(f"attention must have shape ({n_v + 1}, {n_v + 1}) (with [CLS]) or "
                         f"({n_v}, {n_v}) (without) for N_V={n_v} visual tokens, got {tuple(attention.shape)}")
    return rows == n_v + 1


def attention_scores(attention: torch.Tensor | None, n_v: int, *, use_cls: bool | None = None,
                     method: str = "attention") -> torch.Tensor:
    """Attn_i (N_V,) float32: [CLS] attention to each patch, or the column sum without the diagonal.

    use_cls: None = [CLS] row when the shape has one, else the column sum; True demands a [CLS];
    False forces the column sum over the image block even when a [CLS] is present.
    """
    if use_cls is not None and not isinstance(use_cls, bool):
        raise ValueError(f"use_cls must be None, True or False, got {use_cls!r}")
    cls = has_cls(attention, n_v, method=method)
    if use_cls is None:
        use_cls = cls
    elif use_cls and not cls:
        raise ValueError(f"use_cls=True needs attention of shape ({n_v + 1}, {n_v + 1}) with [CLS] first, "
                         f"got {tuple(attention.shape)}; pass use_cls=None or False")
    a = attention.to(torch.float32)
    if use_cls:
        return a[0, 1:].clone()  # (N_V,) A[cls, 1+i]
    img = a[1:, 1:] if cls else a  # (N_V, N_V) image queries x image keys
    return img.sum(dim=0) - torch.diagonal(img)  # (N_V,) sum_{j != i} A[j, i]


def image_keys(keys: torch.Tensor | None, attention: torch.Tensor, n_v: int, *, method: str) -> torch.Tensor:
    """The N_V image rows (N_V, d_k) float32 of `keys`, whose rows must match `attention`'s."""
    if keys is None:
        raise ValueError(f"{method!r} needs keys=({attention.shape[0]}, d_k) head-averaged vision-encoder "
                         "keys of the attention's layer; got None")
    check_matrix("keys", keys)
    if keys.shape[0] != attention.shape[0]:
        raise ValueError(f"keys must have {attention.shape[0]} rows like attention "
                         f"({'[CLS] first, then ' if attention.shape[0] == n_v + 1 else ''}{n_v} visual tokens), "
                         f"got shape {tuple(keys.shape)}")
    return keys[keys.shape[0] - n_v:].to(torch.float32)  # (N_V, d_k), [CLS] row dropped


@register_pruner("attention", stage="vision", capture=Capturable(), needs=("attention",), label="Attention",
                 score_label="attention share", params=(
    Param.choice("use_cls", None, (None, True, False), "rank by the [CLS] row (True), by the column sum (False), "
                 "or whichever the attention's shape offers (None)"),))
def attention_pruner(visual: torch.Tensor, text: torch.Tensor | None, budget: int, *,
                     attention: torch.Tensor | None = None,
                     keys: torch.Tensor | None = None,  # unused; every attention pruner takes the same inputs
                     use_cls: bool | None = None,  # None: [CLS] row if the shape has one, else column sum
                     ) -> Selection:
    """Attention: top-K visual tokens by vision-encoder [CLS] attention (or received attention)."""
    scores = attention_scores(attention, visual.shape[0], use_cls=use_cls).to(visual.device)  # (N_V,)
    order = top_indices(scores, budget)  # (K,) highest attention first, ties to the lowest index
    return Selection.from_order(order, scores)
