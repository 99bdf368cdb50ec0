"""VisPruner (Zhang et al. 2025, "Beyond Text-Visual Attention: Exploiting Visual Cues for Effective
Token Pruning in VLMs").

Original: Theia-4869/VisPruner, `llava/model/llava_arch.py` `LlavaMetaForCausalLM.encode_images`.

    important: I = floor(ratio * K) tokens with the highest Attn_i (attention.py's score: head-mean
               A[cls, 1+i], or sum_{j != i} A[j, i] when the encoder has no [CLS])
    diverse:   R = the other tokens in DESCENDING attention order, f~ their L2-normalised features;
               while |R| > K - I:
                   r = min(drop_per_round, |R| - (K - I), |A|)
                   A, B = the tokens at even / odd positions of R's current order
                   red_a = max_{b in B} cos(f~_a, f~_b) for every a in A   (its best match across)
                   R := [the |A| - r tokens of A with the lowest red_a, by DESCENDING red_a;
                         then every token of B, in order]
    keep = important + the K - I tokens left in R; order = important (by attention), then R's order.

What matches the release: I = int(K * r) (the floor), the descending-attention order of the
leftovers (ties included: same argsort call), the even/odd split of the current order, the
redundancy max_b cos(a, b), dropping the r most redundant of A with r = min(8, |R| - (K - I)), and
the new order [surviving A by descending redundancy, then B]. The released defaults are ratio = 0.5
and 8 per round.

Deliberate deviations, and why:
  * Odd |R|. The released code indexes A's survivors with a batch index of length |R| // 2 - r,
    which assumes |A| = |R| / 2: when |R| is odd (A holds one more token than B, e.g. at K = 63,
    where N_V - I = 545) it raises IndexError (or, in the corner |R| // 2 - r = 0, broadcasting
    silently drops A's last survivor). We keep all |A| - r survivors, so every round removes exactly
    r tokens, the count the released code computes.
  * r is also capped at |A|: with tiny budgets |R| - (K - I) can exceed |A| near the end, where the
    released code fails; the round then removes all of A and the next round continues.
  * Features. The original scores redundancy on the tower's features before the projector
    (`image_features` of `encode_images`, projected only after the selection); so does this one:
    it takes `features` (N_V, d_f), which asks every model adapter for the pre-projector features
    (`Encoded.features`, docs/plugins.md). Only where none are given (`prune` on plain tensors
    without them) it falls back to the projected `visual` tokens.
  * None on ties: they are not rare here (at N_V = 576 on random tokens two float32 redundancies
    of a round coincide exactly in ~3% of the rounds, and in 23 of 54 runs at least once), and a tie
    or a last-bit difference decides the next round's even/odd split. So the cosines come from a plain `u @ u.T` (whose entries are, on the CPU, the
    same bits as the release's per-round a @ b.T; numpy's symmetric product is not) and the order
    from the release's own call, torch.argsort(descending=True) (not stable): on the same device
    both break ties alike (on a GPU the library may pick another kernel per shape: no bit promise).
Cost: important top-K O(N_V log N_V); the diverse stage gathers the (|A|, |B|) block of the cosine
matrix each round, O(|R|^2 / 4) per round for ceil((|R| - (K - I)) / drop_per_round) rounds, with
static shapes and no host sync (GPU). Above `ROUNDS_DENSE_LIMIT` leftovers on the CPU (or when the
cosine matrix would exceed `mi.DENSE_LIMIT` rows) each token's NEIGHBOURS nearest are listed once
instead, and a row whose listed neighbours hold no B member is recomputed: same result, O(|R| L)
per round.
"""
from __future__ import annotations

import math

import torch

from . import mi
from ._registry import Param, register_pruner
from .capture import Capturable
from .attention import attention_scores
from .selection import Selection, check_matrix, unit_rows

NEIGHBOURS = 32  # nearest neighbours listed per token on the sparse path
ROUNDS_DENSE_LIMIT = 1024  # on the CPU, leftovers above this use the sparse path (the dense gather is slow there)
_CHUNK = 1024  # rows per chunk when listing neighbours


def round_sizes(m: int, n_keep: int, drop_per_round: int) -> list[tuple[int, int]]:
    """(|R|, r) of every round of the diverse stage, from |R| = m down to n_keep (host arithmetic)."""
    out = []
    while m > n_keep:
        r = min(drop_per_round, m - n_keep, (m + 1) // 2)
        out.append((m, r))
        m -= r
    return out


def drop_duplicates(features: torch.Tensor, n_keep: int, drop_per_round: int, *, dense: bool | None = None
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """The diverse stage on its own: rows of `features` (M, d_f), IN THEIR GIVEN ORDER, down to n_keep.

    Returns (survivors (n_keep,) int64 in the final order of R, drop_round (M,) int64: the round a
    row was dropped in, -1 for survivors). dense: force the dense (True) or sparse (False) path;
    None picks by device and size (module doc). Both give the same result.
    """
    m = features.shape[0]
    dev = features.device
    drop_round = torch.full((m,), -1, dtype=torch.long, device=dev)
    order = torch.arange(m, device=dev)  # the current order of R, as rows of `features`
    rounds = round_sizes(m, n_keep, drop_per_round) if n_keep > 0 else []
    if not rounds:  # nothing to remove, or no diverse stage at all (n_keep = 0: nothing survives, no round runs)
        return order[:n_keep], drop_round
    u = unit_rows(features)  # (M, d_f), zero rows stay zero
    held = m <= mi.DENSE_LIMIT
    if dense is None:
        dense = held and (dev.type != "cpu" or m <= ROUNDS_DENSE_LIMIT)
    cos = u @ u.T if held else None  # (M, M) or None; a plain matmul: its entries are the release's a @ b.T bits
    if dense:
        if cos is None:
            raise ValueError(f"the dense path needs the cosine matrix: M = {m} > mi.DENSE_LIMIT")
        red_of = lambda a, b, _in_b: cos.index_select(0, a).index_select(1, b).amax(dim=1)  # noqa: E731  (|A|,)
    else:
        red_of = _sparse_redundancy(u, cos)
    in_b = None if dense else torch.zeros(m, dtype=torch.bool, device=dev)  # the sparse path's B membership
    for rnd, (size, r) in enumerate(rounds):
        a, b = order[0::2], order[1::2]  # (|A|,), (|B|,): even / odd positions
        if in_b is not None:
            in_b.zero_()
            in_b.index_fill_(0, b, True)
        red = red_of(a, b, in_b)  # (|A|,) best cosine on the other side
        rank = torch.argsort(red, descending=True)  # (|A|,) most redundant first; the release's call (ties)
        drop_round = drop_round.index_fill(0, a[rank[:r]], rnd)  # no host scalar copied (capturable); vmap-able
        order = torch.cat([a[rank[r:]], b])  # survivors of A by descending redundancy, then B
    return order, drop_round


def _sparse_redundancy(u: torch.Tensor, cos: torch.Tensor | None):
    """red_of(a, b, in_b) from each row's NEIGHBOURS nearest rows (listed once, sorted): if any listed
    neighbour of a is in B, the first such one is a's best match in B (every unlisted row is at most
    as similar); rows with no listed B member are recomputed in full (one host sync per round)."""
    m = u.shape[0]
    n_nb = min(NEIGHBOURS, m)

    def rows(idx):
        return cos.index_select(0, idx) if cos is not None else u[idx] @ u.T  # (len(idx), M)

    lists = [torch.topk(rows(torch.arange(s, min(m, s + _CHUNK), device=u.device)), n_nb, dim=1)
             for s in range(0, m, _CHUNK)]
    nb_val = torch.cat([t.values for t in lists])  # (M, L) descending cosines (self included)
    nb_idx = torch.cat([t.indices for t in lists])  # (M, L)

    def red_of(a, b, in_b):
        hit = in_b[nb_idx[a]]  # (|A|, L) the listed neighbour is in B (a itself is in A)
        red = nb_val[a].masked_fill(~hit, -math.inf).amax(dim=1)  # (|A|,)
        miss = torch.nonzero(~hit.any(dim=1)).flatten()  # rows whose list holds no B member
        if miss.numel() > 0:
            red[miss] = rows(a[miss]).masked_fill(~in_b, -math.inf).amax(dim=1)
        return red

    return red_of


def _dense(n_v: int, params: dict) -> bool:
    """Capturable up to mi.DENSE_LIMIT tokens: above it the diverse stage's sparse path reads counts on the host."""
    return n_v <= mi.DENSE_LIMIT


@register_pruner("vispruner", stage="vision", capture=Capturable(when=_dense), needs=("attention",),
                 label="VisPruner",
                 score_label="attention share", params=(
    Param.real("ratio", 0.5, 0.0, 1.0, "share of the budget kept as important tokens, floored (original: 0.5)",
               code="vr", step=0.05),
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
    if isinstance(drop_per_round, bool) or not isinstance(drop_per_round, int) or drop_per_round < 1:
        raise ValueError(f"drop_per_round must be an int >= 1, got {drop_per_round!r}")
    n_v = visual.shape[0]
    if features is None:
        features = visual
    else:
        check_matrix("features", features)
        if features.shape[0] != n_v:
            raise ValueError(f"features must have N_V={n_v} rows (no [CLS]), got shape {tuple(features.shape)}")
    dev = features.device
    attn = attention_scores(attention, n_v, method="vispruner").to(dev)  # (N_V,)

    n_imp = min(budget, int(budget * ratio))  # I = int(K r), as released
    by_attention = torch.argsort(attn, descending=True)  # (N_V,), the release's call (so its tie order)
    important, rest = by_attention[:n_imp], by_attention[n_imp:]  # rest: descending attention, as released
    survivors, rounds = drop_duplicates(features[rest], budget - n_imp, drop_per_round)
    drop_round = torch.full((n_v,), -1, dtype=torch.long, device=dev).index_put((rest,), rounds)  # vmap-able
    order = torch.cat([important, rest[survivors]])  # (K,) important by attention, then diverse
    return Selection.from_order(order, attn, extras={"important": important, "drop_round": drop_round})
