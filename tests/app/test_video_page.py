"""A video on the page, through its handlers (no page built): the panels' pictures at their own height, a
timeline of tokens kept per frame under each panel, and a click on the grid or on a picked frame inspects
the patch under it (frame, row, col from the token's own box, placed by hand)."""
from __future__ import annotations

import pytest

from components.core.examples import load_examples
from components.core.settings import Settings
from components.page import video as V
from components.page.handlers import Media, controls_for
from components.page.panels import IMAGE_HEIGHT, PANEL_FIELDS
from mipruner.viz import video as viz_video
from mipruner.viz.video import video_params

CLIP = next(e for e in load_examples() if e["kind"] == "video")
IMAGE = next(e for e in load_examples() if e["kind"] == "image")
SETTINGS = Settings(methods=("mi", "random"), budget=0.25)


@pytest.fixture(scope="module")
def clip(handlers):
    return handlers.encode(None, Media(model="shapes-llava", use="video", video=CLIP["path"], prompt=CLIP["prompt"]),
                           controls_for(SETTINGS)).state


def fields_of(view, panel: int) -> list:
    return view.fields[panel * PANEL_FIELDS:(panel + 1) * PANEL_FIELDS]


def test_a_video_gets_tall_pictures_and_a_timeline_an_image_neither(handlers, clip):
    view = handlers.view(clip, controls_for(SETTINGS))
    kept = {m["method"]: m["keep"] for m in view.summary["methods"]}
    frame_of = handlers.logic._engine(clip).encoded(clip.session, clip.key).geometry.frame.tolist()
    for i, method in enumerate(SETTINGS.methods):
        (title, _), (mask_props, mask), heat, *_, (tl_props, timeline) = fields_of(view, i)
        assert mask_props == {"visible": True, "height": "auto"} and mask.size[1] > mask.size[0]  # 4 rows of 2
        assert tl_props == {"visible": True}
        counts = [sum(frame_of[k] == f for k in kept[method]) for f in range(8)]
        assert timeline.info["kept"] == counts and timeline.info["total"] == [196] * 8
    image = handlers.encode(None, Media(model="shapes-llava", image=IMAGE["path"], prompt=IMAGE["prompt"]),
                            controls_for(SETTINGS)).state
    still = handlers.view(image, controls_for(SETTINGS))
    (_, _), (mask_props, _), *_, (tl_props, timeline) = fields_of(still, 0)
    assert mask_props == {"visible": True, "height": IMAGE_HEIGHT} and tl_props == {"visible": False}
    assert timeline is None


@pytest.mark.parametrize("token", [0, 200, 5 * 196 + 3 * 14 + 7, 1567])  # frame 0, 1, 5 (row 3, col 7), 7
def test_a_click_on_the_grid_or_on_a_picked_frame_inspects_that_patch(handlers, clip, token):
    enc = handlers.logic._engine(clip).encoded(clip.session, clip.key)
    geo = enc.geometry
    f, row, col = int(geo.frame[token]), int(geo.row[token]), int(geo.col[token])
    x0, y0, x1, y1 = geo.box[token].tolist()  # in the frame's own pixels
    box = handlers.logic.frame_box(clip, f)  # the frame's cell in the grid
    assert (box[0] > 0) == (f % 2 == 1) and (box[1] > 0) == (f >= 2)  # two a row
    sx = (box[2] - box[0]) / geo.sizes[f][0]
    sy = (box[3] - box[1]) / geo.sizes[f][1]
    cx, cy = (x0 + x1) / 2 * sx, (y0 + y1) / 2 * sy  # the patch's centre inside its cell
    vals = controls_for(SETTINGS)
    on_grid = handlers.inspect(clip, vals, *handlers.click(clip, 0, box[0] + cx, box[1] + cy)).info
    z = V.zoom_of(box)
    on_frame = handlers.inspect(clip, vals, *handlers.click(clip, f + 1, cx * z, cy * z)).info
    for info in (on_grid, on_frame):
        assert (info["token"], info["frame"], info["row"], info["col"]) == (token, f, row, col)


def test_a_picked_frame_fills_the_panel(handlers, clip):
    view = handlers.view(clip, controls_for(SETTINGS), frame=3)
    (_, _), (props, mask), *_ = fields_of(view, 0)
    x0, y0, x1, y1 = handlers.logic.frame_box(clip, 2)
    assert props["height"] == "auto" and mask.size == ((x1 - x0) * V.zoom_of((x0, y0, x1, y1)),) * 2
    assert mask.width >= V.FRAME_PX


def test_evs_shows_its_dissimilarity_over_every_frame_and_the_video_controls(handlers, clip):
    vals = {**controls_for(Settings(methods=("evs", "random"), budget=0.25)), "video_pruning_rate": 0.5}
    view = handlers.view(clip, vals)
    (_, title), _, (heat_props, heat), *_ = fields_of(view, 0)
    assert "EVS" in title and heat_props["visible"] and heat_props["height"] == "auto"
    assert heat_props["label"] == viz_video.DISSIMILARITY_LABEL  # the bar and the map say what they show
    again = handlers.view(clip, {**vals, "budget": 20.0})
    assert fields_of(again, 0)[2][1] is heat  # a budget move leaves the map alone (the same picture)
    assert V.shown_for(clip)["visible"] is True and V.shown_for(None)["visible"] is False
    shown = set(video_params())  # the video methods' own parameters and the per-frame split, nothing an image uses
    assert {"video_pruning_rate", "per_frame", "segments", "merge_beta"} <= shown
    assert not shown & {"lam", "tau", "aggregation", "seed", "layer"}
