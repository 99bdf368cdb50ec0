"""The downsampling baseline `pool`: on a regular grid it IS average pooling (torch's avg_pool2d), every
view is pooled on its own grid, exactly K tokens reach the LLM, each token is the mean of its cell, and
it runs on every family's encodings (the gpu-check rows of tests/test_gpu_check.py run it on every
family x medium too)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import mipruner
from mipruner.testing import check_pruner
from mipruner.pruners.pool import pool_layout


def grid_of(views: list[tuple[int, int]], newlines: bool = False) -> torch.Tensor:
    """(view, row, col) rows for views of (H, W) tokens in row-major order, optionally a newline token
    (view -1) after each row, as LLaVA-NeXT and OneVision lay them out."""
    rows = []
    for v, (h, w) in enumerate(views):
        for r in range(h):
            rows += [(v, r, c) for c in range(w)]
            if newlines:
                rows.append((-1, r, w))
    return torch.tensor(rows, dtype=torch.long)


@pytest.mark.parametrize("side,k,s", [(24, 144, 2), (24, 64, 3), (12, 9, 4), (14, 49, 2)])
def test_on_a_square_grid_pool_is_average_pooling(side, k, s):
    g = torch.Generator().manual_seed(side + k)
    d = 6
    visual = torch.randn(side * side, d, generator=g)
    sel = mipruner.prune("pool", visual=visual, budget=k, grid=grid_of([(side, side)]))
    pooled = F.avg_pool2d(visual.T.reshape(1, d, side, side), s).reshape(d, -1).T  # (K, d) row-major cells
    assert sel.keep.numel() == k and sel.tokens.shape == (k, d)
    cells_row_major = torch.from_numpy(np.argsort(np.argsort(sel.keep.numpy())))  # keep is ascending
    torch.testing.assert_close(sel.tokens[cells_row_major], pooled, atol=1e-6, rtol=0)
    # the kept position of each cell lies inside it: row // s and col // s name the cell
    r, c = sel.keep // side, sel.keep % side
    assert torch.equal((r // s) * (side // s) + c // s, torch.arange(k))


def test_with_fewer_cells_than_views_the_largest_views_get_one():
    grid = grid_of([(2, 2), (3, 3), (1, 1), (3, 3)])
    cell, keep = pool_layout(grid, grid.shape[0], 2)
    kept_views = sorted(grid[keep, 0].tolist())
    assert kept_views == [1, 3] and (cell[grid[:, 0].numpy() % 2 == 0] == -1).all()


@pytest.mark.parametrize("views,k", [([(4, 6), (3, 3)], 7), ([(5, 5), (5, 5), (5, 5)], 10), ([(2, 9)], 5),
                                     ([(6, 4), (1, 1)], 3), ([(7, 3), (3, 7)], 20)])
@pytest.mark.parametrize("newlines", [False, True])
def test_every_view_is_pooled_on_its_own_grid_into_exactly_k_tokens(views, k, newlines):
    grid = grid_of(views, newlines)
    n = grid.shape[0]
    visual = torch.randn(n, 5, generator=torch.Generator().manual_seed(n + k))
    sel = mipruner.prune("pool", visual=visual, budget=k, grid=grid)
    cell, keep = pool_layout(grid, n, k)
    view = grid[:, 0].numpy()
    assert sel.keep.numel() == k and sorted(keep.tolist()) == sel.keep.tolist()
    assert (cell[view < 0] == -1).all(), "newline tokens are dropped first"
    assert set(cell[view >= 0].tolist()) == set(range(k)), "every grid token is in a cell, none is empty"
    for c in range(k):  # a cell never spans two views, and its kept position is one of its members
        members = np.flatnonzero(cell == c)
        assert len(set(view[members].tolist())) == 1 and keep[c] in members
    sizes = [h * w for h, w in views]
    per_view = [len({int(c) for c in cell[view == v]}) for v in range(len(views))]
    assert sum(per_view) == k
    for v, size in enumerate(sizes):  # one cell each, the rest in proportion to the sizes (largest remainder)
        share = (k - len(sizes)) * (size - 1) / (sum(sizes) - len(sizes))
        assert per_view[v] >= 1 and abs(per_view[v] - 1 - share) < 1
    merged = sel.merged_into
    assert (merged[sel.keep] == -1).all() and (merged[torch.from_numpy(view < 0)] == -1).all()
    for row, p in zip(sel.tokens, sel.keep.tolist()):  # each pooled row is the mean of its cell
        members = (merged == p) | (torch.arange(n) == p)
        torch.testing.assert_close(row, visual[members].mean(0), atol=1e-6, rtol=0)
    assert torch.allclose(sel.scores[torch.from_numpy(view >= 0)].sum(), torch.tensor(float(k)))  # weights sum to 1 per cell


def test_keep_all_is_the_unpruned_input_and_without_a_grid_a_square_is_assumed():
    visual = torch.randn(36, 4, generator=torch.Generator().manual_seed(0))
    sel = mipruner.prune("pool", visual=visual, budget=36)
    assert sel.keep.tolist() == list(range(36)) and sel.tokens is None
    sel = mipruner.prune("pool", visual=visual, budget=9)  # 6 x 6 -> 2 x 2 pooling
    pooled = F.avg_pool2d(visual.T.reshape(1, 4, 6, 6), 2).reshape(4, -1).T
    torch.testing.assert_close(sel.tokens, pooled, atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="grid must be"):
        mipruner.prune("pool", visual=visual, budget=9, grid=torch.zeros(35, 3, dtype=torch.long))


def test_pool_passes_the_method_contract_and_answers_on_the_embedded_model():
    assert check_pruner("pool") == []
    adapter = mipruner.load("shapes-llava")
    enc = adapter.encode("assets/examples/scene_3.png", "what color is the triangle?")
    h, w = enc.geometry.grids[0]
    sel = mipruner.select(adapter, enc, "pool", (h // 2) * (w // 2), cache={})
    assert sel.budget == (h // 2) * (w // 2)
    ans = mipruner.answer(adapter, enc, sel, max_new_tokens=2)
    assert ans.visual_tokens == sel.budget
    assert mipruner.answer(adapter, enc, mipruner.select(adapter, enc, "pool", enc.n_visual), max_new_tokens=4).token_ids \
        == mipruner.answer(adapter, enc, None, max_new_tokens=4).token_ids
