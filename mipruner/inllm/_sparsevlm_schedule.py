"""SparseVLM's budget schedule and token accounting: the released settings (Gumpest/SparseVLMs,
llava/model/language_model/score.py `sparse_token_dict`, `layer_dict`; modelling_sparse_llama.py
`LlamaDynamicvitModel.forward` for the recycling counts and the "Equal Tokens" log), and how a
budget K of N_V tokens on a decoder of any depth maps onto them. Pure arithmetic; `sparsevlm.py`
is the method.
"""
from __future__ import annotations

import math

RELEASED_DEPTH = 32
RELEASED_LAYERS = (3, 7, 16)  # first layer on each pruned sequence: the original's pruning_loc (2, 6, 15) + 1
RELEASED_TOKENS = 576
RELEASED_COUNTS = {64: (66, 30, 17), 96: (238, 48, 26), 128: (303, 110, 36), 192: (300, 200, 110)}
MERGE_SIZE = 10  # recycled tokens per cluster: int(n / 10) + 1 clusters


def schedule(budget: int, n_visual: int, n_layers: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(layers, counts) of the stages keeping K = `budget` of N_V tokens on `n_layers` layers.

    Stages: min(3, n_layers - 1), at least 1: the last ones of the released three. Layer of stage
    s: round(n_layers * K_s / 32) (K_s = 3, 7, 16, half up), then made strictly increasing within
    [1, n_layers - 1] (1 on a 1-layer decoder). Counts: c_1, c_2 interpolated linearly in
    x = K * 576 / N_V through the released settings' (final, c_1, c_2) = (17, 66, 30), (26, 238, 48),
    (36, 303, 110), (110, 300, 200) and (0, 0, 0), (576, 576, 576), scaled by N_V / 576, rounded
    half up and clamped so N_V >= c_1 >= c_2 >= c_3 = K.
    """
    m = max(1, min(3, n_layers - 1))
    layers: list[int] = []
    for s, k_s in enumerate(RELEASED_LAYERS[3 - m:]):
        lo, hi = max(s + 1, layers[-1] + 1 if layers else 1), max(1, n_layers - m + s)
        layers.append(min(max(math.floor(n_layers * k_s / RELEASED_DEPTH + 0.5), lo), hi))
    anchors = [(0, 0, 0)] + sorted((c[2], c[0], c[1]) for c in RELEASED_COUNTS.values()) \
        + [(RELEASED_TOKENS,) * 3]
    x = budget * RELEASED_TOKENS / n_visual
    i = next(j for j in range(len(anchors) - 1) if x <= anchors[j + 1][0])
    (x0, a0, b0), (x1, a1, b1) = anchors[i], anchors[i + 1]
    t = (x - x0) / (x1 - x0)
    scale = n_visual / RELEASED_TOKENS
    c2 = min(n_visual, max(budget, math.floor((b0 + t * (b1 - b0)) * scale + 0.5)))
    c1 = min(n_visual, max(c2, math.floor((a0 + t * (a1 - a0)) * scale + 0.5)))
    return tuple(layers), (c1, c2, budget)[3 - m:]


def recycle_counts(n_dropped: int, ratio: float) -> tuple[int, int]:
    """(tokens recycled, clusters) of a stage that dropped n tokens: int(ratio n) + 1 (at most n),
    int(n_r / 10) + 1 clusters; (0, 0) when nothing is dropped or ratio = 0."""
    if n_dropped == 0 or ratio <= 0:
        return 0, 0
    n_r = min(n_dropped, int(n_dropped * ratio) + 1)
    return n_r, min(n_r, n_r // MERGE_SIZE + 1)


def planned_tokens(counts, n_visual: int, ratio: float) -> list[int]:
    """Visual tokens present after each stage: c_s + the clusters of its pool (the tokens present
    before, minus c_s); independent of the scores."""
    out, before = [], n_visual
    for c in counts:
        out.append(c + recycle_counts(before - c, ratio)[1])
        before = out[-1]
    return out


def equivalent_tokens(layers, after, n_visual: int, n_layers: int) -> float:
    """The release's layer-averaged count ("Equal Tokens" in its log): each layer counted with the
    visual tokens after it, `after[s]` from the layer before stage s on."""
    per_layer = [n_visual] * (layers[0] - 1) + [a for a, k0, k1 in zip(after, layers, tuple(layers[1:]) + (
        n_layers + 1,)) for _ in range(k1 - k0)]
    return sum(per_layer) / n_layers
