"""A video drawn so it can be read (mipruner.viz.video): frames in a grid whose pixels map back to the right
token, the tokens kept per frame as a bar chart, and the temporal dissimilarity over every frame. Synthetic
encodings, no model."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import mipruner
from mipruner import viz
from mipruner.viz import video as viz_video
from mipruner.bench.slider import synthetic_encoded
from mipruner.pruners import Selection


@pytest.fixture(scope="module")
def clip():
    return synthetic_encoded(5, grid=4, size=40, dim=16, n_text=4, seed=3)  # 5 frames x 16 tokens of 10 px


def test_a_grid_of_two_a_row_maps_every_pixel_back_to_its_token(clip):
    lay = viz.build_layout(clip, columns=2, gap=4)
    assert lay.size == (2 * 40 + 4, 3 * 40 + 2 * 4)  # 5 frames: rows of 2, 2, 1
    assert [lay.frame_box(f) for f in range(5)] == [(0, 0, 40, 40), (44, 0, 84, 40), (0, 44, 40, 84),
                                                     (44, 44, 84, 84), (0, 88, 40, 128)]
    geo = clip.geometry
    for i in range(clip.n_visual):  # the centre of each token's box, placed by hand from its frame's cell
        f = int(geo.frame[i])
        x0, y0, x1, y1 = geo.box[i].tolist()
        gx, gy = (f % 2) * 44 + (x0 + x1) / 2, (f // 2) * 44 + (y0 + y1) / 2
        assert viz.token_at(clip, None, gx, gy, layout=lay) == i
        got = lay.locate(gx, gy)
        assert got[0] == f and viz.token_at(clip, f, got[1], got[2]) == i
    assert viz.token_at(clip, None, 42, 10, layout=lay) is None  # the gap between the columns
    assert viz.token_at(clip, None, 60, 110, layout=lay) is None  # the empty cell after frame 5
    sel = mipruner.prune("random", visual=clip.visual, budget=0.5, seed=1)
    grid = np.asarray(viz.kept_mask(clip, sel, layout=lay))
    assert np.array_equal(np.asarray(viz.kept_mask(clip, sel, frame=3, layout=lay)), grid[44:84, 44:84])
    with pytest.raises(ValueError, match="frame"):
        lay.frame_box(5)


def test_the_strip_is_still_the_default_and_the_page_gets_the_grid(clip):
    assert viz.build_layout(clip, gap=4).size == (5 * 40 + 4 * 4, 40)
    lay = viz_video.video_layout(clip)  # the page's: two a row, frames enlarged to MIN_FRAME_PX
    assert lay.frame_wh == [(viz_video.MIN_FRAME_PX,) * 2] * 5
    assert lay.size == (2 * viz_video.MIN_FRAME_PX + 4, 3 * viz_video.MIN_FRAME_PX + 2 * 4)
    i = 37  # frame 2, row 1, col 1: its box, scaled, in the first cell of the second row
    x0, y0, x1, y1 = (v * viz_video.MIN_FRAME_PX / 40 for v in clip.geometry.box[i].tolist())
    assert viz.token_at(clip, None, (x0 + x1) / 2, lay.frame_y[2] + (y0 + y1) / 2, layout=lay) == i
    image = synthetic_encoded(1, grid=4, size=40, dim=16, n_text=4)
    assert viz_video.video_layout(image).size == (40, 40)  # an image: as it was
    assert not viz_video.is_video(image) and viz_video.is_video(clip)


def test_the_timeline_counts_and_draws_the_tokens_kept_per_frame(clip):
    keep = torch.tensor([0, 1, 2, 3, 16, 17, 40, 41, 42, 43, 44, 45, 46, 47, 79])  # frames 0:4, 1:2, 2:8, 4:1
    kept, total = viz_video.frames_kept(clip, Selection(keep=keep, order=keep, scores=torch.zeros(80), method="x"))
    assert kept.tolist() == [4, 2, 8, 0, 1] and total.tolist() == [16] * 5
    img = viz_video.timeline(clip, Selection(keep=keep, order=keep, scores=torch.zeros(80), method="x"))
    assert img.info["kept"] == [4, 2, 8, 0, 1] and img.info["total"] == [16] * 5
    arr = np.asarray(img).astype(int)
    blue = (np.abs(arr - np.array(viz_video.KEPT_RGB)).sum(-1) == 0)  # (H, W) pixels of a kept bar
    _, bars, zero, per_token, _, _ = viz_video._axes((16,) * 5, 480, 140)
    plot = slice(int(zero - 16 * per_token) - 1, int(zero) + 1)  # the bars' rows (the legend is above them)
    heights = [int(blue[plot, x0 + 2:x1 - 2].any(1).sum()) for x0, x1 in bars]  # rows of blue in each bar
    assert heights[3] == 0 and all(h > 0 for i, h in enumerate(heights) if i != 3)
    for h, k in zip(heights, [4, 2, 8, 0, 1]):
        assert abs(h - k * per_token) <= 1.5  # the bar is as tall as the count (px per token from the axes)


def _dissimilarity_by_position(enc) -> torch.Tensor:
    """A restatement: the token at the same (row, col) of the previous frame, looked up one by one."""
    geo = enc.geometry
    at = {(int(f), int(r), int(c)): i for i, (f, r, c) in enumerate(zip(geo.frame, geo.row, geo.col))}
    out = torch.full((enc.n_visual,), float("nan"))
    for (f, r, c), i in at.items():
        if f > 0:
            a, b = enc.visual[i].double(), enc.visual[at[(f - 1, r, c)]].double()
            out[i] = float(1 - a @ b / (a.norm() * b.norm()))
    return out


def test_the_temporal_dissimilarity_is_one_minus_cos_to_the_same_patch_of_the_previous_frame(clip):
    d = viz_video.temporal_dissimilarity(clip)
    want = _dissimilarity_by_position(clip)
    assert d.shape == (80,) and d[:16].isnan().all() and not d[16:].isnan().any()
    torch.testing.assert_close(d, want, atol=1e-5, rtol=0, equal_nan=True)


def test_the_dissimilarity_map_paints_every_frame_but_the_first(clip):
    lay = viz_video.video_layout(clip)
    img = viz_video.dissimilarity_heatmap(clip, layout=lay)
    arr = np.asarray(img)
    x0, y0, x1, y1 = lay.frame_box(0)
    assert np.array_equal(arr[y0:y1, x0:x1], lay.base[y0:y1, x0:x1])  # frame 0: no value, the picture
    for f in range(1, 5):
        x0, y0, x1, y1 = lay.frame_box(f)
        assert (arr[y0:y1, x0:x1] != lay.base[y0:y1, x0:x1]).any(-1).mean() > 0.9
    d = viz_video.temporal_dissimilarity(clip)
    assert img.info["vmin"] == pytest.approx(float(d[16:].min())) and img.info["vmax"] == pytest.approx(float(d[16:].max()))
    barred = viz.with_colorbar(img, img.info["label"])  # a tall grid: its bar underneath, the frames keep the width
    assert barred.width == img.width and barred.height > img.height
    assert barred.info["label"] == viz_video.DISSIMILARITY_LABEL
    one = np.asarray(viz_video.dissimilarity_heatmap(clip, frame=3, layout=lay))
    x0, y0, x1, y1 = lay.frame_box(3)
    assert np.array_equal(one, arr[y0:y1, x0:x1])


def test_evs_gets_the_map_of_the_dissimilarity_it_ranked_by(clip):
    d = viz_video.temporal_dissimilarity(clip)
    sel = mipruner.prune("evs", visual=clip.visual, budget=30, frame_index=clip.frame_index)
    assert sel.extras["dissimilarity"].shape == (5, 16)  # (T, P), as EVS leaves it
    torch.testing.assert_close(viz_video.temporal_values(clip, sel), d, equal_nan=True)
    rnd = mipruner.prune("random", visual=clip.visual, budget=30)
    assert viz_video.temporal_values(clip, rnd) is None
    image = synthetic_encoded(1, grid=4, size=40, dim=16, n_text=4)
    assert viz_video.temporal_values(image, sel) is None  # an image has no time
