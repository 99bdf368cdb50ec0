"""Visual tokens that own vision-tower patches (`Layout`): each token's (kind, frame, row, col), the
patch -> token ownership with pixel boxes, the tokens' geometry (a box = the union of its patches), and
the tower's per-view attention and keys pooled to tokens (`token_attention`). Shared by the families
whose tokens are built from views of a tower (LLaVA-OneVision, InternVL); each family's own layout
module fills a `Layout` in its model's token order."""
from __future__ import annotations

import math

import torch

from ..base import TokenGeometry


class Layout:
    """Accumulates tokens (kind, frame, row, col) and patch -> token ownership with pixel boxes."""

    def __init__(self, n_views: int, n_pos: int):
        self.n_views, self.n_pos = n_views, n_pos
        self.kind: list[str] = []
        self.frame, self.row, self.col = [], [], []
        self.owner = torch.full((n_views, n_pos), -1, dtype=torch.long)
        self.pbox = torch.zeros(n_views, n_pos, 4, dtype=torch.float64)
        self.fixed: dict[int, torch.Tensor] = {}  # token -> box for tokens that own no patch
        self.grids, self.sizes = [], []

    def add(self, kind: str, frame: torch.Tensor, row: torch.Tensor, col: torch.Tensor) -> int:
        start = len(self.kind)
        self.kind += [kind] * int(frame.numel())
        self.frame.append(frame.long()), self.row.append(row.long()), self.col.append(col.long())
        return start

    def own(self, view, pos, token, box) -> None:
        self.owner[view, pos] = token
        self.pbox[view, pos] = box

    def geometry(self) -> TokenGeometry:
        n = len(self.kind)
        own = self.owner.flatten()
        seen = own >= 0
        boxes = self.pbox.view(-1, 4)[seen]
        idx = own[seen]
        lo = torch.full((n, 2), math.inf, dtype=torch.float64).scatter_reduce(
            0, idx[:, None].expand(-1, 2), boxes[:, :2], "amin")
        hi = torch.full((n, 2), -math.inf, dtype=torch.float64).scatter_reduce(
            0, idx[:, None].expand(-1, 2), boxes[:, 2:], "amax")
        box = torch.cat([lo, hi], -1)
        for t, b in self.fixed.items():
            box[t] = b
        box = torch.where(torch.isfinite(box), box, torch.zeros((), dtype=box.dtype))
        return TokenGeometry(frame=torch.cat(self.frame), row=torch.cat(self.row), col=torch.cat(self.col),
                             box=box.float(), kind=list(self.kind), grids=list(self.grids), sizes=list(self.sizes))


def token_attention(lay: Layout, att: torch.Tensor, keys: torch.Tensor, offset: int):
    """Per-view attention (views, n, n) and keys (views, n, d) of the tower -> (N_V, N_V) over the
    visual tokens (a token's row: the mean over its patches of the attention summed over each
    other token's patches; 0 across views and for newlines) and keys (N_V, d) (mean over patches).
    `offset`: hidden-state rows before the first patch (1 when the "default" strategy drops one)."""
    n, dev = len(lay.kind), att.device
    out = torch.zeros(n, n, dtype=att.dtype, device=dev)
    ksum = torch.zeros(n, keys.shape[-1], dtype=keys.dtype, device=dev)
    count = torch.zeros(n, dtype=att.dtype, device=dev)
    for v, pos, tok in owned(lay, dev):
        a = att[v][pos + offset][:, pos + offset]  # (p, p) patch queries x patch keys
        cols = torch.zeros(a.shape[0], n, dtype=att.dtype, device=dev).index_add_(1, tok, a)  # summed per key token
        out.index_add_(0, tok, cols)
        ksum.index_add_(0, tok, keys[v][pos + offset])
        count.index_add_(0, tok, torch.ones_like(tok, dtype=att.dtype))
    div = count.clamp_min(1)
    return out / div[:, None], ksum / div[:, None]


def owned(lay: Layout, device) -> list[tuple[int, torch.Tensor, torch.Tensor]]:
    """(view, patch positions, their tokens) of every view that owns a patch, the indices on `device`
    (found on the host, where the layout lives: no device sync per view)."""
    out = []
    for v in range(lay.n_views):
        own = lay.owner[v]
        pos = torch.nonzero(own >= 0).flatten()
        if pos.numel():
            out.append((v, pos.to(device), own[pos].to(device)))
    return out


__all__ = ["Layout", "owned", "token_attention"]
