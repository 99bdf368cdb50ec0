"""ToMe before the LLM (Bolya et al., "Token Merging: Your ViT But Faster", arXiv:2210.09461): bipartite soft
matching merges the most alike visual tokens, in rounds, until K remain.

Original: facebookresearch/ToMe, `tome/merge.py`, `bipartite_soft_matching` and `merge_wavg` (the rule), as
ModelTC/LightCompress applies it to a multimodal LLM's visual tokens (`llmc/compression/token_reduction/
tome.py`, class `ToMe`: the same two functions inside each CLIP encoder layer, r tokens a layer, on the
layer's head-mean keys). Here the rule runs once, before the LLM, on the projected visual tokens, which are
both its metric and what it merges, in rounds until exactly K are left (a fixed-K method):

    rounds  the N - K merges shared evenly over R rounds (`tome_rounds`, default 8; the earlier rounds take the
            remainder), r <= floor(L / 2) a round (the matching's limit; rounds are added while rows are left)
    rows x (L, d) with sizes s (L,) (1 at the start); a round of r merges:
      m      = x / ||x||  (rows)                          a = m[0::2] (even rows), b = m[1::2] (odd rows)
      S      = a b^T; node_max, node_idx = max over b of S (the first maximum on ties)
      edges  = argsort(node_max, descending): the r first even rows (src) go into their best odd row (dst
               = node_idx), the other even rows stay (unm)
      merge  (merge_wavg): dst := (s_dst x_dst + sum s_src x_src) / (s_dst + sum s_src), sizes summed
      rows   := [unm rows, every odd row]  (the release's order: its next round alternates on it)
    keep    = the original index each remaining row stands for: an unmerged row its own, a dst row its odd
              token's (the positions the LLM reads them at are those tokens' original ones)
    tokens  = the remaining rows, in `keep` order, in `visual`'s dtype; merged_into = for every merged token
              the kept token its row went into (through every round); scores = each kept token's size (how
              many tokens its row averages), 0 for the merged ones.

Options for fidelity to the release (`Param`s):
    tome_order  "sequence" (default): the unmerged rows in their current order before the next round, as the
                release orders them with its class token (`class_token=True`, which LightCompress passes;
                here no row is protected: the visual tokens have no [CLS]); "edge": in the order of their
                edges, as the release without a class token.
    tome_ties   "lowest" (default): edges with equal node_max in index order (a stable sort); "release":
                `torch.argsort(descending=True)` as released, ties left to the kernel (differs by device).
    tome_dtype  "float32" (default): matching and averaging in float32; "input": in `visual`'s dtype (bf16 or
                fp16), as the release computes in the model's dtype (its kept sets differ on near-ties).

Deviations, on purpose: the rounds (ToMe removes r tokens in each of a ViT's layers, recomputing the metric from
each layer's keys; here the merged rows are the next round's metric, so K is reached before the LLM on every
family, whatever its encoder; a round of r = L / 2 merges every even row, so fewer, larger rounds keep the odd
positions whatever the content: 8 rounds by default); a zero row normalises to zero (the release's division gives
NaN); the release's `scatter_reduce(sum)` is an `index_add` (the same sums; much faster on the CPU). K = N_V runs
no round: every token, unchanged (`tokens` None), the unpruned model. Cost: O(L^2 d / 4) a round, about
log2(N_V / K) rounds; shapes are fixed by (N_V, K): one capturable computation (`Capturable(batch=False)`).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ._registry import Param, register_pruner
from .capture import Capturable
from .selection import Selection

ORDERS = ("sequence", "edge")
TIES = ("lowest", "release")
DTYPES = ("float32", "input")


def merge_round(x: torch.Tensor, size: torch.Tensor, stands: torch.Tensor, r: int, *, order: str = "sequence",
                ties: str = "lowest") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One round of bipartite soft matching on rows x (L, d) of sizes `size` (L,) standing at the original indices
    `stands` (L,), r merges (r <= L // 2): (rows (L - r, d), sizes, stands (L - r,), where (L,) int64: the new
    row each old row went to)."""
    dev = x.device
    if x.dtype == torch.float32:
        m = F.normalize(x, dim=-1, eps=1e-12)
    else:  # the release's x / ||x|| in the input dtype
        m = x / x.norm(dim=-1, keepdim=True).clamp_min(torch.finfo(x.dtype).tiny)
    a, b = m[0::2], m[1::2]  # (La, d), (Lb, d)
    node_max, node_idx = (a @ b.T).max(dim=-1)  # (La,)
    edges = (torch.sort(node_max, descending=True, stable=True).indices if ties == "lowest"
             else torch.argsort(node_max, descending=True))
    unm, src = edges[r:], edges[:r]
    if order == "sequence":
        unm = torch.sort(unm).values
    dst = node_idx[src]  # (r,) odd rows
    n_unm = unm.numel()

    def merged(y: torch.Tensor) -> torch.Tensor:  # merge_wavg's merge(y, mode="sum"): [unm rows, odd rows]
        ya, yb = y[0::2], y[1::2]
        # the release's scatter_reduce(sum) as index_add: the same sums (on the CPU the same order), and on the
        # CPU scatter_reduce over an expanded index is three orders of magnitude slower
        return torch.cat([ya[unm], yb.index_add(0, dst, ya[src])])

    total = merged(size[:, None])  # (L - r, 1)
    rows = merged(x * size[:, None]) / total  # merge_wavg: sum(s x) / sum(s), every row (unmerged: s x / s)
    where_a = torch.empty(a.shape[0], dtype=torch.long, device=dev)
    where_a = where_a.index_copy(0, unm, torch.arange(n_unm, device=dev)).index_copy(0, src, n_unm + dst)
    where = torch.empty(x.shape[0], dtype=torch.long, device=dev)
    where[0::2] = where_a
    where[1::2] = n_unm + torch.arange(b.shape[0], device=dev)
    return rows, total[:, 0], torch.cat([stands[0::2][unm], stands[1::2]]), where


def schedule(n: int, k: int, rounds: int) -> list[int]:
    """Merges per round from n rows to k: the N - K removals shared evenly over `rounds` rounds (the earlier
    ones get the remainder), each at most half its rows (the matching's limit); more rounds while rows are left."""
    out, rows = [], n
    while rows > k:
        left = max(rounds - len(out), 1)
        r = min(-(-(rows - k) // left), rows // 2)
        out.append(r)
        rows -= r
    return out


def tome_merge(visual: torch.Tensor, budget: int, *, order: str = "sequence", ties: str = "lowest",
               dtype: str = "float32", rounds: int = 8
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rounds of `merge_round` until `budget` rows remain: (rows (K, d) in the compute dtype, sizes (K,),
    stands (K,) the original index each row stands at, group (N_V,) the final row of every token)."""
    n, dev = visual.shape[0], visual.device
    x = visual.to(torch.float32) if dtype == "float32" else visual
    size = torch.ones(n, dtype=x.dtype, device=dev)
    stands = torch.arange(n, device=dev)
    group = torch.arange(n, device=dev)
    for r in schedule(n, budget, rounds):  # host ints: the rounds are fixed by (N_V, K)
        x, size, stands, where = merge_round(x, size, stands, r, order=order, ties=ties)
        group = where[group]
    return x, size, stands, group


@register_pruner("tome", stage="projector", label="ToMe (merge)", capture=Capturable(batch=False),
                 score_label="tokens merged into it (count)", params=(
    Param.integer("tome_rounds", 8, 1, 64, "ToMe: rounds of matching the N - K merges are shared over (a ViT's "
                  "layers each merge r; at most half the rows a round)"),
    Param.choice("tome_order", "sequence", ORDERS,
                 "ToMe: unmerged rows before the next round in their order (sequence, the release with its class "
                 "token) or in their edges' order (edge, the release without one)"),
    Param.choice("tome_ties", "lowest", TIES,
                 "ToMe: equal matches ranked by index (lowest) or by torch.argsort as released (release; the "
                 "kernel's order, which differs by device)"),
    Param.choice("tome_dtype", "float32", DTYPES,
                 "ToMe: match and average in float32, or in the tokens' own dtype as the release (input)")))
def tome_pruner(visual: torch.Tensor, text: torch.Tensor | None, budget: int, *, tome_rounds: int = 8,
                tome_order: str = "sequence",
                tome_ties: str = "lowest", tome_dtype: str = "float32") -> Selection:
    """ToMe: bipartite soft matching merges the most alike visual tokens, in rounds, until K remain."""
    n, dev = visual.shape[0], visual.device
    if budget >= n:  # no round: the unpruned input
        return Selection.from_order(torch.arange(n, device=dev), torch.ones(n, dtype=torch.float32, device=dev))
    rows, size, stands, group = tome_merge(visual, budget, order=tome_order, ties=tome_ties, dtype=tome_dtype,
                                            rounds=tome_rounds)
    keep, perm = torch.sort(stands)
    owner = stands[group]  # (N_V,) the kept token each token's row stands at
    idx = torch.arange(n, device=dev)
    merged_into = torch.where(owner == idx, torch.full_like(owner, -1), owner)
    scores = torch.zeros(n, dtype=torch.float32, device=dev).index_copy(0, stands, size.to(torch.float32))
    return Selection(keep=keep, order=stands, scores=scores, tokens=rows[perm].to(visual.dtype),
                     merged_into=merged_into, extras={"size": size.to(torch.float32)[perm]})


__all__ = ["DTYPES", "ORDERS", "TIES", "merge_round", "schedule", "tome_merge", "tome_pruner"]
