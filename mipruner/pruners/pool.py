"""Pool: the downsampling baseline. The visual grid average-pooled to K tokens, each image's, tile's and
frame's own 2D grid on its own, so a comparison shows whether a method beats simply seeing less
resolution (the question raised by "Are We Using the Right Benchmark: An Evaluation Framework for
Visual Token Compression Methods", arXiv:2510.07143, where plain downsampling beats many pruners).

    grid: (N_V, 3) int64 rows (view, row, col) from the encoding's geometry (`TokenGeometry.grid`):
          a view is one (frame, kind) of the encoding (an image, a video frame, LLaVA-NeXT's base view
          or its tiles' grid, InternVL's tiles or thumbnail); tokens outside every grid (LLaVA-NeXT's
          and OneVision's row newlines) have view -1. Without `grid`, N_V is one square grid when it is
          a perfect square, else one row.
    K tokens, exactly: every view gets one cell and the other K - V are shared in proportion to the
    views' sizes (largest remainder, exact integers, ties to the earlier view; with K < V views, the K
    largest views get one each); a view of H x W tokens given k cells gets a bands of
    rows, a = the integer in [ceil(k / W), min(H, k)] closest to sqrt(k H / W) (the view's aspect),
    band i holding b_i = floor(k / a) or one more cells (the first k mod a bands one more). Band i
    covers rows [floor(i H / a), floor((i + 1) H / a)); its cell j covers columns
    [floor(j W / b_i), floor((j + 1) W / b_i)): non-overlapping, none empty, every token in one cell.
    A view whose tokens do not fill their H x W rectangle is pooled as one row in index order.
    token_c := mean of the visual rows in cell c (float32, returned in `visual`'s dtype); the kept
    position of cell c (what masks show, where the adapters splice it) is its middle member in index
    order. Tokens outside every grid are dropped first; at K = N_V nothing is pooled (keep-all is the
    unpruned model).
    Selection: keep = the K kept positions; tokens = the K means in `keep` order; scores = 1 / (tokens
    in the token's cell), the weight each token has in its pooled row; merged_into = (N_V,) the kept
    position each other token of a cell was pooled into (-1 for the kept ones and the dropped newlines),
    which the app draws.
The cells are laid out on the host from the geometry (host metadata, a few thousand integers) once per
(grid, K) and memoized on the device (`device_layout`, shapes fixed by N_V and K); a call is then one
index_add and one division on the device of `visual`: one capturable computation
(`capture.Capturable(static=("grid",))`: the grid is keyed by its content, not copied into a CUDA graph's
buffers). Under a caller's `torch.compile` the memo lookup is one opaque operator (`traced_layout`,
`mipruner::pool_layout`), so `mipruner.prune("pool", ...)` traces as ONE graph (fullgraph) as every other
fixed-K method does.
"""
from __future__ import annotations

import math
import threading
from collections import OrderedDict

import numpy as np
import torch

from ._registry import register_pruner
from .capture import Capturable, content_key
from .selection import Selection


def _apportion(sizes: list[int], k: int) -> list[int]:
    """k cells over views of `sizes` tokens: one for each view (the largest views first when k is
    smaller than their number), the rest in proportion to the sizes beyond that first token (largest
    remainder in integer arithmetic, ties to the earlier view); none above its size."""
    if k < len(sizes):
        first = sorted(range(len(sizes)), key=lambda i: (-sizes[i], i))[:k]
        return [1 if i in first else 0 for i in range(len(sizes))]
    extra, room = k - len(sizes), [s - 1 for s in sizes]
    total = sum(room)
    if total == 0:
        return [1] * len(sizes)
    quota = [extra * r // total for r in room]
    rest = sorted(range(len(sizes)), key=lambda i: (-(extra * room[i] % total), i))
    for i in rest[: extra - sum(quota)]:
        quota[i] += 1
    return [1 + q for q in quota]


def _bands(h: int, w: int, k: int) -> list[int]:
    """Cells per row band for k cells on an h x w grid (see the module docstring)."""
    lo, hi = -(-k // w), min(h, k)
    a = min(range(lo, hi + 1), key=lambda r: (abs(r - math.sqrt(k * h / w)), r))
    return [k // a + (1 if i < k % a else 0) for i in range(a)]


def _cells(rows: np.ndarray, cols: np.ndarray, k: int) -> np.ndarray:
    """Cell id in [0, k) of each token of one view (its rows and cols)."""
    r, c = rows - rows.min(), cols - cols.min()
    h, w = int(r.max()) + 1, int(c.max()) + 1
    if h * w != rows.size or np.unique(r * w + c).size != rows.size:  # not a full rectangle: one row
        h, w, r, c = 1, rows.size, np.zeros_like(rows), np.arange(rows.size)
    per_band = np.array(_bands(h, w, k), dtype=np.int64)
    band = (r * per_band.size) // h  # row band of each token
    first = np.cumsum(per_band) - per_band  # first cell id of each band
    return first[band] + (c * per_band[band]) // w


def pool_layout(grid: torch.Tensor | None, n: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(cell (N_V,) int64 in [0, K), -1 for dropped tokens; keep (K,) the kept position of each cell), on
    the host: the geometry is host metadata, read once (`grid`'s one copy), never per token."""
    if grid is None:
        side, idx = math.isqrt(n), np.arange(n)
        g = np.stack([np.zeros(n, np.int64), idx // side, idx % side] if side * side == n
                     else [np.zeros(n, np.int64), np.zeros(n, np.int64), idx], 1)
    else:
        g = grid.detach().cpu().numpy().astype(np.int64)
    if g.shape != (n, 3):
        raise ValueError(f"grid must be (N_V, 3) = ({n}, 3) rows of (view, row, col), got {tuple(g.shape)}")
    cell = np.full(n, -1, dtype=np.int64)
    on = g[:, 0] >= 0
    n_on = int(on.sum())
    if k > n_on:  # every grid token kept, and the first k - n_on of the others (index order)
        cell[on] = np.arange(n_on)
        cell[np.flatnonzero(~on)[: k - n_on]] = np.arange(n_on, k)
    else:
        members = [np.flatnonzero(g[:, 0] == v) for v in np.unique(g[on, 0])]
        base = 0
        for idx, kv in zip(members, _apportion([m.size for m in members], k)):
            if kv:
                cell[idx] = base + _cells(g[idx, 1], g[idx, 2], kv)
                base += kv
    order = np.argsort(cell * (n + 1) + np.arange(n), kind="stable")  # by cell, then index
    counts = np.bincount(cell[cell >= 0], minlength=k)
    starts = np.cumsum(counts) - counts + int((cell < 0).sum())
    return cell, order[starts + (counts - 1) // 2]  # each cell's middle member in index order


# (grid content, N_V, K, device) -> the layout's device tensors; bounded (least recently used dropped)
_LAYOUTS: "OrderedDict[tuple, tuple[torch.Tensor, ...]]" = OrderedDict()
MAX_LAYOUTS = 64
_LOCK = threading.Lock()


def device_layout(grid: torch.Tensor | None, n: int, k: int, device: torch.device) -> tuple[torch.Tensor, ...]:
    """(slot (N_V,) each token's row in `keep` order, K for a dropped token, counts (K,) float32 members per
    row, keep (K,) ascending, weight (N_V,) float32, merged (N_V,) int64) on `device`: shapes fixed by (N_V, K).
    Computed on the host once per (grid content, N_V, K, device) and memoized (the grid is host metadata:
    an encoding's grid lives where its geometry does, on the host, so reading it waits for no device), so a
    call afterwards (a CUDA-graph replay included) is device work only."""
    key = (content_key(grid), n, k, str(device))
    with _LOCK:
        hit = _LAYOUTS.get(key)
        if hit is not None:
            _LAYOUTS.move_to_end(key)
            return hit
    cell, keep = pool_layout(grid, n, k)
    on = cell >= 0
    counts = np.bincount(cell[on], minlength=k)
    weight = np.where(on, 1.0 / counts[np.maximum(cell, 0)], 0.0).astype(np.float32)
    rank = np.empty(k, dtype=np.int64)  # cell -> its row in `keep` order
    rank[np.argsort(keep, kind="stable")] = np.arange(k)
    slot = np.where(on, rank[np.maximum(cell, 0)], k)  # dropped tokens go to row K, which is thrown away
    merged = np.full(n, -1, dtype=np.int64)
    merged[on] = keep[cell[on]]
    merged[keep] = -1  # a kept position is not merged into itself
    host = lambda a: torch.from_numpy(np.ascontiguousarray(a)).to(device)  # noqa: E731
    out = (host(slot), host(counts[np.argsort(rank)].astype(np.float32)), host(np.sort(keep)), host(weight),
           host(merged))
    with _LOCK:
        _LAYOUTS[key] = out
        while len(_LAYOUTS) > MAX_LAYOUTS:
            _LAYOUTS.popitem(last=False)
    return out


@torch.library.custom_op("mipruner::pool_layout", mutates_args=())
def traced_layout(grid: torch.Tensor | None, visual: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor,
                                                                                   torch.Tensor, torch.Tensor,
                                                                                   torch.Tensor]:
    """`device_layout` as one opaque operator for a caller's `torch.compile`: the memo lookup (host Python, a
    lock, the grid's content read on the host) is not something dynamo traces, so a compiled pool call holds
    it as one node whose output shapes are fixed by (N_V, K), and the whole selection stays one graph.
    `visual` gives N_V and the device. Outputs are copies (an operator's outputs are its own)."""
    return tuple(t.clone() for t in device_layout(grid, visual.shape[0], k, visual.device))


@traced_layout.register_fake
def _(grid, visual, k):
    n = visual.shape[0]
    return (visual.new_empty(n, dtype=torch.long), visual.new_empty(k, dtype=torch.float32),
            visual.new_empty(k, dtype=torch.long), visual.new_empty(n, dtype=torch.float32),
            visual.new_empty(n, dtype=torch.long))


@register_pruner("pool", stage="projector", label="Pool (downsampling)", score_label="weight in its pooled token",
                 capture=Capturable(static=("grid",), batch=False))  # batched, its layout copy broke CUDA capture
def pool_pruner(visual: torch.Tensor, text: torch.Tensor | None, budget: int, *,
                grid: torch.Tensor | None = None) -> Selection:
    """Pool: each image's, tile's and frame's grid average-pooled to K tokens in all (downsampling)."""
    n, dev = visual.shape[0], visual.device
    if budget >= n:  # keep-all: the unpruned input
        keep = torch.arange(n, device=dev)
        return Selection.from_order(keep, torch.ones(n, device=dev))
    if torch.compiler.is_compiling():  # a caller's torch.compile: the host lookup as one opaque node
        return pooled(visual, traced_layout(grid, visual, budget))
    return pooled(visual, device_layout(grid, n, budget, dev))


def pooled(visual: torch.Tensor, layout: tuple[torch.Tensor, ...]) -> Selection:
    """The Selection of `visual` pooled by a `device_layout`: device work only (what a CUDA graph records)."""
    slot, counts, keep, weight, merged = layout
    budget, dev = keep.shape[0], visual.device
    v = visual.to(torch.float32)
    sums = torch.zeros(budget + 1, v.shape[-1], dtype=v.dtype, device=dev).index_add(0, slot, v)  # row K: dropped
    tokens = sums[:budget] / counts[:, None]
    # the memoized tensors are copied: a caller may write into its selection
    return Selection.from_order(keep.clone(), weight.clone(), tokens=tokens.to(visual.dtype),
                                merged_into=merged.clone())


__all__ = ["device_layout", "pooled", "pool_layout", "pool_pruner", "traced_layout"]
