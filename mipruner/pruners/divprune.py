"""DivPrune (Alvar et al. 2025, "DivPrune: Diversity-based Visual Token Pruning for Large Multimodal
Models"): keep the most diverse visual tokens (max-min diversity, text-agnostic).

Original: vbdi/divprune, `LLaVA/llava/model/llava_arch.py` `LlavaMetaForCausalLM.DivPrune` (called
from `prepare_inputs_labels_for_multimodal` on the projected visual tokens, as here).

    v~                 L2-normalised rows of V (N_V, d)
    d_ij = 1 - cos(v_i, v_j) = 1 - (v~ v~^T)_ij
    first pick:   argmax_i  min_{j != i} d_ij          (the token farthest from its nearest neighbour)
    then:         argmax_{i not in S}  min_{j in S} d_ij     until |S| = K

The inner minimum is kept as a running vector m_i = min_{j in S} d_ij; adding j costs one column of
the cosine matrix and an elementwise minimum, O(N_V) (plus O(N_V d) when the column is recomputed).

Memory: up to `mi.DENSE_LIMIT` tokens the cosine matrix is built once with `gram()` and its columns
are reused. Above it the N_V x N_V matrix is never held: the first pick's nearest-neighbour distances
are computed in row chunks, and each greedy step recomputes the one column it needs, O(N_V d).

Scores: a picked token's min-distance to the set at the step it was picked (for the first pick, to
its nearest neighbour); an unpicked token's min-distance to the final set. Ties go to the lowest
index. Rows of zero norm have cosine 0, i.e. distance 1, to everything.

What matches the release: the distance 1 - cos on the projected tokens, the first pick by
nearest-neighbour distance (its second-smallest column entry), then argmax of the min-distance
to the picked set; argmax keeps the first index on ties, as ours.
Deliberate deviations, and why:
  * The release excludes itself from the first pick's minimum by taking the second-smallest
    distance (self ~ 0); we mask the diagonal: the same except for exact duplicates, where both
    see distance 0.
  * Picked tokens are masked out. The release relies on their distance to themselves (~0) being
    the smallest, so once only duplicates of picked tokens remain it can pick one twice and return
    fewer distinct tokens; we always return K distinct tokens.
  * Budget: the release takes a share, int(round(ratio * N)) with Python's round-half-to-even; an
    int budget here is exact and a share rounds half up (the registry's rule for every method).
  * Zero-norm rows: the release divides by 0 (NaN); ours gives them cosine 0.
"""
from __future__ import annotations

import torch

from . import mi
from ._registry import register_pruner
from .capture import Capturable
from .selection import Selection, gram, unit_rows

_CHUNK = 1024  # rows per chunk for the first pick when the cosine matrix is not held


class CosineColumns:
    """cos(v_i, v_j) of L2-normalised rows, by column or row block; dense only up to DENSE_LIMIT.

    Read `mi.DENSE_LIMIT` at construction (not import) time, so one setting governs every pruner.
    """

    def __init__(self, visual: torch.Tensor):
        self.u = unit_rows(visual)  # (N_V, d) float32, zero rows stay zero
        self.n = self.u.shape[0]
        self.cos = gram(self.u) if self.n <= mi.DENSE_LIMIT else None  # (N_V, N_V) or None

    @property
    def dense(self) -> bool:
        return self.cos is not None

    def col(self, j: int) -> torch.Tensor:
        """cos(v_i, v_j) for every i: (N_V,)."""
        return self.cos[:, j] if self.cos is not None else self.u @ self.u[j]  # (N_V, d) @ (d,) -> (N_V,)

    def cols(self, idx: torch.Tensor) -> torch.Tensor:
        """cos(v_j, v_i) for j in idx (m,) and every i: (m, N_V) (the matrix is symmetric: rows = columns).
        idx stays on the device: no host copy."""
        if self.cos is not None:
            return self.cos.index_select(0, idx)
        return self.u.index_select(0, idx) @ self.u.T  # (m, d) @ (d, N_V) -> (m, N_V)

    def rows(self, start: int, stop: int) -> torch.Tensor:
        """cos(v_i, v_j) for i in [start, stop) and every j: a fresh (stop - start, N_V) tensor."""
        if self.cos is not None:
            return self.cos[start:stop].clone()
        return self.u[start:stop] @ self.u.T  # (chunk, d) @ (d, N_V) -> (chunk, N_V)


def nearest_neighbour_distance(cos: CosineColumns) -> torch.Tensor:
    """min_{j != i} (1 - cos_ij) for every i: (N_V,), computed in row chunks of `_CHUNK`.

    With a single token there is no neighbour; its distance is reported as 0 (not +inf), so
    scores stay finite.
    """
    n, dev = cos.n, cos.u.device
    if n == 1:
        return torch.zeros(1, device=dev)
    out = torch.empty(n, device=dev)
    for start in range(0, n, _CHUNK):
        stop = min(n, start + _CHUNK)
        block = cos.rows(start, stop)  # (chunk, N_V)
        block.diagonal(start).fill_(-torch.inf)  # exclude j == i: entries (r, start + r); a fill, no host scalar copy
        out[start:stop] = 1.0 - block.max(dim=1).values  # (chunk,)
    return out


# capture: one graph; not batched (its greedy writes into its own state in place, which torch.vmap cannot batch)
@register_pruner("divprune", capture=Capturable(batch=False), label="DivPrune",
                 score_label="distance to the kept set (1 - cosine)")
def divprune(visual: torch.Tensor, text: torch.Tensor | None, budget: int) -> Selection:
    """DivPrune: greedy max-min diversity over cosine distance, without looking at the prompt."""
    cos = CosineColumns(visual)
    n = cos.n
    first = nearest_neighbour_distance(cos)  # (N_V,)
    # Rows of the distance matrix with d_jj = -inf: the running minimum m_i = min_{j in S} d_ij then
    # holds -inf for every picked token, which takes it out of the race (no later minimum can raise it).
    if cos.dense:
        dist = (1.0 - cos.cos).fill_diagonal_(-torch.inf)  # (N_V, N_V), built once

        def dist_rows(idx: torch.Tensor) -> torch.Tensor:
            return dist.index_select(0, idx)  # (m, N_V)
    else:
        def dist_rows(idx: torch.Tensor) -> torch.Tensor:  # (m, N_V), O(N_V d) a row
            return (1.0 - cos.cols(idx)).scatter_(1, idx[:, None], -torch.inf)

    best, j = torch.max(first.view(1, n), 1)  # (1,), (1,): ties to the lowest index
    picks, gains = [j], [best]  # each pick, and its min-distance to the set when picked
    min_dist = dist_rows(j)  # (1, N_V) m_i
    for _ in range(1, budget):  # three kernels a step: max, one row read, minimum; no host copy
        best, j = torch.max(min_dist, 1)
        picks.append(j)
        gains.append(best)
        min_dist = torch.minimum(min_dist, dist_rows(j))  # O(N_V): running min over S
    order = torch.cat(picks)  # (K,)
    scores = min_dist[0].clone()  # unpicked: distance to the final set
    scores.index_copy_(0, order, torch.cat(gains))
    return Selection.from_order(order, scores, extras={"nearest_neighbour_distance": first})
