"""VisPruner (Zhang et al. 2025): important tokens by [CLS] attention, then diverse ones by dropping duplicates.

    important: I = round(ratio * K) tokens with the highest Attn_i (attention.py's score: head-mean
               A[cls, 1+i], or sum_{j != i} A[j, i] when the encoder has no [CLS])
    diverse:   R = the other tokens in index order, f~ their L2-normalised features; while |R| > K - I:
                   A, B = the tokens at even / odd positions of R's current order
                   red_a = max_{b in B} cos(f~_a, f~_b) for every a in A   (its best match across)
                   drop the r = min(drop_per_round, |R| - (K - I)) tokens of A with the highest
                   red_a (ties: earliest position first); the survivors keep their relative order
    keep = important + the K - I surviving tokens of R.

Written from the method's description (PEERS.md), not from its code. Choices and deviations:
  * The original scores redundancy on pre-projector features (the encoder output the projector
    reads). Pass them as `features` (N_V, d_f); without them we fall back to the projected
    `visual` tokens, so the result then depends on the projector.
  * After a round the survivors keep their relative order (our reading of "split alternately"),
    so the even/odd split of the next round re-mixes neighbours whose parity shifted.
  * The last round drops only what is still needed, so exactly K tokens are kept.
Cost: O(N_V log N_V) for the important top-K; the cosine matrix of R once (O(|R|^2 d_f), held up to
DENSE_LIMIT tokens) and each token's NEIGHBOURS nearest, then O(|R| NEIGHBOURS) per round (plus
O(|R|) per row whose listed neighbours are all gone or on its own side) for
ceil((|R| - (K - I)) / drop_per_round) rounds.
"""
from __future__ import annotations

import math

import torch

from ._registry import Param, register_pruner
from .attention import attention_scores
from .mi import DENSE_LIMIT
from .selection import Selection, check_matrix, check_range, gram, unit_rows


NEIGHBOURS = 32  # nearest neighbours listed per token; a row whose list has no B member is recomputed
_CHUNK = 1024  # rows per chunk when listing neighbours


def _cos_rows(u: torch.Tensor, cos: torch.Tensor | None, rows: torch.Tensor) -> torch.Tensor:
    return cos.index_select(0, rows) if cos is not None else u[rows] @ u.T  # (len(rows), M)


def drop_duplicates(features: torch.Tensor, n_keep: int, drop_per_round: int
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """The diverse stage on its own: which rows of `features` (M, d_f) survive, M -> n_keep.

    Returns (survivors (n_keep,) int64 ascending, drop_round (M,) int64: the round a row was
    dropped in, -1 for survivors). n_keep == 0 means no diverse stage: nothing survives, no round runs.

    Exact, but not by taking the (|A|, |B|) block every round (13 ms a round at M = 2000 here, and
    hundreds of rounds): each token's NEIGHBOURS most similar tokens are listed once, sorted. If
    any listed neighbour of a is in B, the first such one is a's best match in B (every unlisted
    token is at most as similar); rows with no listed B member are recomputed in full.
    """
    m = features.shape[0]
    if n_keep == 0:
        return torch.zeros(0, dtype=torch.long), torch.full((m,), -1, dtype=torch.long)
    u = unit_rows(features).cpu()  # (M, d_f), zero rows stay zero
    cos = gram(u) if m <= DENSE_LIMIT else None  # (M, M) or None
    n_nb = min(NEIGHBOURS, m)
    lists = [torch.topk(_cos_rows(u, cos, torch.arange(s, min(m, s + _CHUNK))), n_nb, dim=1)
             for s in range(0, m, _CHUNK)]
    nb_val = torch.cat([t.values for t in lists])  # (M, L) descending cosines (self included)
    nb_idx = torch.cat([t.indices for t in lists])  # (M, L)
    alive = torch.arange(m)  # current order: positions into `features`
    in_b = torch.zeros(m, dtype=torch.bool)
    drop_round = torch.full((m,), -1, dtype=torch.long)
    rnd = 0
    while alive.numel() > n_keep:
        a, b = alive[0::2], alive[1::2]  # (|A|,), (|B|,): even / odd positions
        in_b.zero_()
        in_b[b] = True
        hit = in_b[nb_idx[a]]  # (|A|, L) listed neighbour is alive and in B (a itself is in A)
        red = nb_val[a].masked_fill(~hit, -math.inf).amax(dim=1)  # (|A|,) best match on the other side
        miss = torch.nonzero(~hit.any(dim=1)).flatten()  # rows whose list holds no B member
        if miss.numel() > 0:
            red[miss] = _cos_rows(u, cos, a[miss]).masked_fill(~in_b, -math.inf).amax(dim=1)
        r = min(drop_per_round, alive.numel() - n_keep, a.numel())
        worst = torch.sort(red, descending=True, stable=True).indices[:r]  # (r,) most redundant
        drop_round[a[worst]] = rnd
        gone = torch.zeros(alive.numel(), dtype=torch.bool)
        gone[2 * worst] = True  # A's k-th token sits at position 2k
        alive = alive[~gone]
        rnd += 1
    return alive, drop_round


@register_pruner("vispruner", stage="vision", needs=("attention",), label="VisPruner",
                 score_label="attention share", params=(
    Param.real("ratio", 0.5, 0.0, 1.0, "share of the budget kept as important tokens (original: 0.5)", code="vr",
               step=0.05),
    Param.integer("drop_per_round", 8, 1, None, "duplicates removed per round of the diverse stage (original: 8)",
                  code="vdrop")))
def vispruner_pruner(visual: torch.Tensor, text: torch.Tensor | None, budget: int, *,
                     attention: torch.Tensor | None = None,
                     keys: torch.Tensor | None = None,  # unused; every attention pruner takes the same inputs
                     features: torch.Tensor | None = None,  # (N_V, d_f) pre-projector features; None: `visual`
                     ratio: float = 0.5,  # original: half the budget important, half diverse
                     drop_per_round: int = 8,  # original: 8 duplicates removed per round
                     ) -> Selection:
    """VisPruner: top tokens by [CLS] attention, then diverse ones by removing duplicates round by round."""
    ratio = check_range("ratio", ratio, 0.0, 1.0)
    if isinstance(drop_per_round, bool) or not isinstance(drop_per_round, int) or drop_per_round < 1:
        raise ValueError(f"drop_per_round must be an int >= 1, got {drop_per_round!r}")
    n_v = visual.shape[0]
    attn = attention_scores(attention, n_v, method="vispruner")  # (N_V,)
    if features is None:
        features = visual
    else:
        check_matrix("features", features)
        if features.shape[0] != n_v:
            raise ValueError(f"features must have N_V={n_v} rows (no [CLS]), got shape {tuple(features.shape)}")

    n_imp = min(budget, int(math.floor(ratio * budget + 0.5)))  # I = round(K r)
    important = torch.topk(attn, n_imp).indices.cpu()  # (I,) highest attention first
    rest_mask = torch.ones(n_v, dtype=torch.bool)
    rest_mask[important] = False
    rest = torch.nonzero(rest_mask).flatten()  # (N_V - I,) ascending
    survivors, rounds = drop_duplicates(features[rest], budget - n_imp, drop_per_round)
    drop_round = torch.full((n_v,), -1, dtype=torch.long)
    drop_round[rest] = rounds
    order = torch.cat([important, rest[survivors]])  # (K,) important by attention, then diverse
    return Selection.from_order(order, attn, extras={"important": important, "drop_round": drop_round})
