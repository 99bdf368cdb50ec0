"""Rendering: masks match the Selection pixel for pixel, heatmaps follow the values, pivot colours
follow argmax PMI, and click lookup inverts the token boxes. Synthetic encodings, no model."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import mipruner
from mipruner import viz
from mipruner.bench.slider import synthetic_encoded
from mipruner.models.base import TokenGeometry


@pytest.fixture(scope="module")
def image_enc():
    return synthetic_encoded(1, grid=6, size=48, dim=16, n_text=5, seed=1)  # 36 tokens of 8 px


@pytest.fixture(scope="module")
def video_enc():
    return synthetic_encoded(3, grid=4, size=40, dim=16, n_text=4, seed=2)  # 3 frames x 16 tokens


def _mi(enc, budget=10):
    return mipruner.prune("mi", visual=enc.visual, text=enc.scoring_text, budget=budget)


def _interior(lay, i):
    x0, y0, x1, y1 = lay.rects[i]
    return (slice(y0 + 1, y1 - 1), slice(x0 + 1, x1 - 1))  # skip the grid-line pixels


@pytest.mark.parametrize("which", ["image_enc", "video_enc"])
def test_mask_kept_cells_equal_selection(which, request):
    enc = request.getfixturevalue(which)
    lay = viz.build_layout(enc, grid_alpha=0.0)
    sel = mipruner.prune("random", visual=enc.visual, budget=0.3, seed=3)
    img = np.asarray(viz.kept_mask(enc, sel, layout=lay))
    assert img.shape[:2] == lay.base.shape[:2]
    kept = set(sel.keep.tolist())
    for i in range(enc.n_visual):
        ys, xs = lay.rects[i][[1, 3]], lay.rects[i][[0, 2]]
        cell = img[ys[0]:ys[1], xs[0]:xs[1]]
        ref = (lay.base if i in kept else lay.dimmed)[ys[0]:ys[1], xs[0]:xs[1]]
        assert np.array_equal(cell, ref), i
    # dimmed really differs from clear, so the check above distinguishes kept from dropped
    assert (lay.dimmed.astype(int) < lay.base.astype(int)).mean() > 0.5


def test_mask_frame_crop_and_strip_layout(video_enc):
    lay = viz.build_layout(video_enc, gap=4)
    assert lay.size == (3 * 40 + 2 * 4, 40)
    sel = _mi(video_enc)
    strip = np.asarray(viz.kept_mask(video_enc, sel, layout=lay))
    one = np.asarray(viz.kept_mask(video_enc, sel, frame=2, layout=lay))
    assert np.array_equal(one, strip[:, 88:128])
    with pytest.raises(ValueError, match="frame"):
        viz.kept_mask(video_enc, sel, frame=3, layout=lay)


def test_heatmap_follows_pmi_order(image_enc):
    sel = _mi(image_enc)
    lay = viz.build_layout(image_enc, grid_alpha=0.0)
    j = 2
    img = np.asarray(viz.pmi_heatmap(image_enc, sel, j, layout=lay, alpha=1.0)).astype(int)
    lut = viz.colormap_lut("viridis").astype(int)
    idx = []
    for i in range(image_enc.n_visual):
        px = img[_interior(lay, i)].reshape(-1, 3)
        assert (px == px[0]).all()  # one flat colour per box
        idx.append(int(np.argmin(((lut - px[0]) ** 2).sum(1))))
    pmi = sel.pmi[:, j].numpy()
    order = np.argsort(pmi, kind="stable")
    assert all(np.diff(np.array(idx)[order]) >= 0)  # colour index monotone in PMI
    assert idx[int(order[0])] == 0 and idx[int(order[-1])] == 255


def test_scores_heatmap_blends_and_validates(image_enc):
    lay = viz.build_layout(image_enc)
    vals = torch.arange(image_enc.n_visual, dtype=torch.float32)
    a0 = np.asarray(viz.scores_heatmap(image_enc, vals, layout=lay, alpha=0.0))
    assert np.array_equal(a0, lay.base)  # alpha 0 = the picture itself
    const = viz.color_index(torch.ones(5))
    assert (const == 128).all()
    with pytest.raises(ValueError, match="one entry per visual token"):
        viz.scores_heatmap(image_enc, vals[:-1], layout=lay)
    with pytest.raises(ValueError, match="token_index"):
        viz.pmi_heatmap(image_enc, _mi(image_enc), 99, layout=lay)
    rnd = mipruner.prune("random", visual=image_enc.visual, budget=4)
    with pytest.raises(ValueError, match="MI selection"):
        viz.pivot_map(image_enc, rnd, layout=lay)


def test_pivot_colours_match_argmax(video_enc):
    sel = _mi(video_enc)
    lay = viz.build_layout(video_enc, grid_alpha=0.0)
    img, legend = viz.pivot_map(video_enc, sel, layout=lay, alpha=1.0)
    img = np.asarray(img)
    colour_of = {tok: hx for tok, hx in legend}
    argmax = sel.pmi.argmax(dim=1).tolist()
    toks = video_enc.scoring_tokens
    assert set(colour_of) == {toks[j] for j in argmax}
    assert len(set(colour_of.values())) == len(colour_of)  # distinct colours
    for i in range(video_enc.n_visual):
        r, g, b = img[_interior(lay, i)].reshape(-1, 3)[0]
        assert "#%02x%02x%02x" % (r, g, b) == colour_of[toks[argmax[i]]]
    counts = [sum(toks[a] == t for a in argmax) for t, _ in legend]
    assert counts == sorted(counts, reverse=True)  # most frequent first


def test_token_at_inverts_boxes(video_enc):
    geo = video_enc.geometry
    lay = viz.build_layout(video_enc)
    for i in range(video_enc.n_visual):
        x0, y0, x1, y1 = geo.box[i].tolist()
        f = int(geo.frame[i])
        assert viz.token_at(video_enc, f, (x0 + x1) / 2, (y0 + y1) / 2) == i
        assert viz.token_at(video_enc, f, x0, y0) == i  # half-open boxes: the corner belongs to i
        sx0, sy0, sx1, sy1 = lay.rects[i]
        assert viz.token_at(video_enc, None, (sx0 + sx1) / 2, (sy0 + sy1) / 2, layout=lay) == i
    assert viz.token_at(video_enc, 0, 40.0, 5.0) is None  # right edge is outside
    assert viz.token_at(video_enc, None, 41, 5, layout=lay) is None  # the gap between frames


def test_downscaled_layout_locate_roundtrip():
    enc = synthetic_encoded(2, grid=4, size=64, dim=8, n_text=3)
    lay = viz.build_layout(enc, max_side=32, gap=2)
    assert lay.size == (66, 32)
    for i in range(enc.n_visual):
        sx0, sy0, sx1, sy1 = lay.rects[i]
        f, x, y = lay.locate((sx0 + sx1) / 2, (sy0 + sy1) / 2)
        assert viz.token_at(enc, f, x, y) == i


def test_newline_tokens_are_ignored_and_smallest_box_wins(image_enc):
    enc = synthetic_encoded(1, grid=2, size=20, dim=8, n_text=3)
    geo = enc.geometry
    # add a whole-image box (token 4) and a newline token with a box (token 5)
    box = torch.cat([geo.box, torch.tensor([[0.0, 0, 20, 20], [0, 0, 20, 10]])])
    enc.geometry = TokenGeometry(frame=torch.zeros(6, dtype=torch.long), row=torch.tensor([0, 0, 1, 1, 0, 0]),
                                 col=torch.tensor([0, 1, 0, 1, 0, 2]), box=box,
                                 kind=geo.kind + ["base", "newline"], grids=geo.grids, sizes=geo.sizes)
    enc.visual = torch.randn(6, 8)
    lay = viz.build_layout(enc)
    assert not lay.has_box[5] and lay.has_box[4]
    assert viz.token_at(enc, 0, 3, 3) == 0 and viz.token_at(enc, None, 3, 3, layout=lay) == 0
    assert set(np.unique(lay.label).tolist()) == {0, 1, 2, 3}
    cells = viz.token_cells(enc, mipruner.prune("random", visual=enc.visual, budget=2))
    assert cells[5].box is None and cells[5].kind == "newline" and sum(c.kept for c in cells) == 2


def test_token_cells_and_pmi_row(image_enc):
    sel = _mi(image_enc, budget=7)
    cells = viz.token_cells(image_enc, sel)
    assert [c.index for c in cells] == list(range(image_enc.n_visual))
    assert sorted(c.index for c in cells if c.kept) == sel.keep.tolist()
    assert cells[7].box == tuple(image_enc.geometry.box[7].tolist()) and (cells[7].row, cells[7].col) == (1, 1)
    assert cells[3].score == pytest.approx(float(sel.scores[3]))
    row = viz.pmi_row(image_enc, sel, 5)
    assert [t for t, _ in row] == image_enc.scoring_tokens
    assert [p for _, p in row] == pytest.approx(sel.pmi[5].tolist())
    with pytest.raises(ValueError):
        viz.pmi_row(image_enc, sel, image_enc.n_visual)


def test_viz_does_not_import_pyplot_or_gradio():
    import subprocess
    import sys

    code = ("import sys, mipruner, mipruner.viz, mipruner.serve.service;"
            "from mipruner.bench.slider import synthetic_encoded as s;"
            "e = s(1, 2, 8, dim=4, n_text=2);"
            "mipruner.viz.scores_heatmap(e, [0., 1., 2., 3.]);"
            "assert 'matplotlib.pyplot' not in sys.modules and 'gradio' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


def _bar_indices(strip: np.ndarray, lut: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Nearest colormap index and RGB distance to it of every pixel of `strip` (..., 3)."""
    px = strip.reshape(-1, 3).astype(int)
    d = ((px[:, None, :] - lut[None, :, :].astype(int)) ** 2).sum(-1)  # (P, 256)
    return d.argmin(1).reshape(strip.shape[:-1]), np.sqrt(d.min(1)).reshape(strip.shape[:-1])


def _gradient_lines(region: np.ndarray, lut: np.ndarray, along: int) -> list[np.ndarray]:
    """The lines of `region` (columns: along=0, rows: along=1) that are colormap gradients: >= 80% of
    their pixels on the colormap; returns their index profiles (pixels on the colormap only)."""
    idx, dist = _bar_indices(region, lut)
    lines = []
    for k in range(region.shape[1 - along]):
        i, d = (idx[:, k], dist[:, k]) if along == 0 else (idx[k], dist[k])
        if (d < 12).mean() >= 0.8:
            lines.append(i[d < 12])
    return lines


def test_scores_heatmap_records_its_range_and_pmi_its_word(image_enc):
    lay = viz.build_layout(image_enc)
    vals = torch.linspace(-2.0, 3.0, image_enc.n_visual)
    img = viz.scores_heatmap(image_enc, vals, layout=lay)
    assert (img.info["vmin"], img.info["vmax"]) == pytest.approx((-2.0, 3.0)) and img.info["cmap"] == "viridis"
    fixed = viz.scores_heatmap(image_enc, vals, layout=lay, vmin=0.0, vmax=1.0)
    assert (fixed.info["vmin"], fixed.info["vmax"]) == (0.0, 1.0)
    sel = _mi(image_enc)
    pmi = viz.pmi_heatmap(image_enc, sel, 1, layout=lay)
    col = sel.pmi[:, 1]
    assert (pmi.info["vmin"], pmi.info["vmax"]) == pytest.approx((float(col.min()), float(col.max())))
    assert pmi.info["label"] == f"PMI with {image_enc.scoring_tokens[1]!r} (nats)"


def test_colour_bar_reads_the_heatmap_values(image_enc, video_enc):
    lut = viz.colormap_lut("viridis")
    # a square picture: the bar goes on its right, vmax at the top, vmin at the bottom
    pic = viz.scores_heatmap(image_enc, torch.arange(image_enc.n_visual, dtype=torch.float32),
                             layout=viz.build_layout(image_enc))
    big = pic.resize((240, 240))  # as the app shows it: text sized from the picture
    big.info.update(pic.info)
    out = viz.with_colorbar(big, "score (units)")
    assert out.height == 240 and out.width > 240 and out.info["label"] == "score (units)"
    assert np.array_equal(np.asarray(out)[:, :240], np.asarray(big.convert("RGB")))  # the picture is untouched
    cols = _gradient_lines(np.asarray(out)[:, 240:], lut, along=0)
    assert len(cols) >= 3  # the bar is several pixels wide
    for c in cols:
        assert c[0] > 240 and c[-1] < 15  # the whole colormap, top (vmax) to bottom (vmin)
        assert (np.diff(c.astype(int)) <= 2).all()  # decreasing downwards (JPEG-free: exact up to rounding)
    # a strip of frames: the bar goes underneath, vmin on the left
    strip = viz.scores_heatmap(video_enc, torch.arange(video_enc.n_visual, dtype=torch.float32),
                               layout=viz.build_layout(video_enc))
    wide = viz.with_colorbar(strip, "score")
    assert wide.width == strip.width and wide.height > strip.height
    rows = _gradient_lines(np.asarray(wide)[strip.height:], lut, along=1)
    assert rows and all(r[0] < 15 and r[-1] > 240 and (np.diff(r.astype(int)) >= -2).all() for r in rows)


def test_colour_bar_needs_a_range_and_is_memoised(image_enc):
    from PIL import Image

    with pytest.raises(ValueError, match="value range"):
        viz.with_colorbar(Image.new("RGB", (40, 40)), "score")
    const = viz.scores_heatmap(image_enc, torch.ones(image_enc.n_visual), layout=viz.build_layout(image_enc))
    assert const.info["vmin"] == const.info["vmax"] == 1.0
    assert viz.with_colorbar(const, "score").width > const.width  # a constant map still gets a (+-0.5) bar
    a = viz.colorbar(0.0, 1.0, "score", 100, 10)
    assert viz.colorbar(0.0, 1.0, "score", 100, 10) is a  # a slider move that keeps the range re-renders nothing


def test_every_method_says_what_its_scores_are():
    from mipruner.serve.service import method_specs

    labels = {s.name: s.score_label for s in method_specs()}
    assert labels["random"] is None  # random draws: nothing to colour
    assert all(isinstance(v, str) and v.strip() for k, v in labels.items() if k != "random")
    assert "nats" in labels["mi"]


def test_colour_bars_do_not_import_pyplot():
    import subprocess
    import sys

    code = ("import sys, mipruner.viz as v;"
            "from mipruner.bench.slider import synthetic_encoded as s;"
            "e = s(1, 2, 8, dim=4, n_text=2);"
            "v.with_colorbar(v.scores_heatmap(e, [0., 1., 2., 3.]), 'score');"
            "assert 'matplotlib.pyplot' not in sys.modules and 'gradio' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)
