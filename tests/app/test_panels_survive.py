"""Every panel survives every budget (issue: a video view died drawing its per-frame chart at low budgets):
each method at 1, 2, one frame's tokens - 1, + 0, + 1 and all N_V tokens, on the example image and clip,
through the page's handlers (no page built); a drawing that fails costs its own panel with one sentence,
never the view; a refused slider move leaves the panels as they are and says why in the refusal line."""
from __future__ import annotations

import gradio as gr
import numpy as np
import pytest

from components.core.examples import load_examples
from components.core.logic import MAX_PANELS
from components.core.settings import Settings
from components.page.handlers import Media, controls_for
from components.page.panels import PANEL_FIELDS
from mipruner.viz import video as viz_video
from mipruner.serve.service import method_specs

IMAGE = next(e for e in load_examples() if e["kind"] == "image")
CLIP = next(e for e in load_examples() if e["kind"] == "video")
METHODS = [s.name for s in method_specs()]
VIDEO_ONLY = {s.name for s in method_specs() if s.video}


def _encode(handlers, kind: str):
    ex = CLIP if kind == "video" else IMAGE
    media = Media(model="shapes-llava", use=kind, prompt=ex["prompt"], **{kind: ex["path"]})
    return handlers.encode(None, media, controls_for(Settings(methods=("random",)))).state


@pytest.fixture(scope="module")
def image(handlers):
    return _encode(handlers, "image")


@pytest.fixture(scope="module")
def clip(handlers):
    return _encode(handlers, "video")


def budgets(st) -> list[int]:
    """1, 2, one frame -1/0/+1 and N_V (the ones in range, once each)."""
    frame = st.n_visual // max(st.n_frames, 1)
    return sorted({k for k in (1, 2, frame - 1, frame, frame + 1, st.n_visual) if 1 <= k <= st.n_visual})


def _views(handlers, st, methods, k):
    return handlers.logic.view(st, Settings(methods=tuple(methods), budget=int(k)))[0]


@pytest.mark.parametrize("kind", ["image", "video"])
def test_every_method_draws_its_panel_at_every_budget(handlers, image, clip, kind):
    st = clip if kind == "video" else image
    assert (st.n_frames > 1) == (kind == "video")
    ks = budgets(st)
    assert len(ks) == (6 if kind == "video" else 4), ks
    problems = []
    for k in ks:
        for i in range(0, len(METHODS), MAX_PANELS):  # a full page of panels at a time
            for v in _views(handlers, st, METHODS[i:i + MAX_PANELS], k):
                if v.error is not None:
                    if not (kind == "image" and v.method in VIDEO_ONLY and "does not apply" in v.error):
                        problems.append((v.method, k, v.error))
                    continue
                assert v.mask is not None and v.heatmap is not None and 1 <= v.kept <= k, (v.method, k)
                if kind == "video":
                    assert sum(v.timeline.info["kept"]) == len(v.selection.keep), (v.method, k)  # VisionZip: + merged ones
                    assert v.timeline.info["total"] == [st.n_visual // st.n_frames] * st.n_frames
                else:
                    assert v.timeline is None
    assert not problems, problems


def test_one_kept_token_of_a_frame_shows_as_a_bar_at_any_height():
    total = (196,) * 8
    for height in (100, 140, 600):
        img = viz_video._timeline((1, 0, 0, 0, 0, 0, 0, 196), total, 480, height)
        rgb = np.asarray(img)
        bars = viz_video._axes(total, 480, height)[1]
        kept = (rgb == viz_video.KEPT_RGB).all(-1)
        first, second, last = (kept[:, x0:x1].any() for x0, x1 in bars[[0, 1, 7]])
        assert first and not second and last, height
        assert img.info["kept"] == [1, 0, 0, 0, 0, 0, 0, 196]


def test_a_panel_that_cannot_be_drawn_costs_only_that_panel(handlers, clip, monkeypatch):
    real, calls = viz_video.timeline, []

    def broken(enc, sel, **kw):  # the panels are drawn in order: the second one is random's
        calls.append(1)
        if len(calls) == 2:
            raise ValueError("a drawing bug")
        return real(enc, sel, **kw)

    monkeypatch.setattr(viz_video, "timeline", broken)
    views = _views(handlers, clip, ("mi", "random", "similarity"), 3)
    by = {v.method: v for v in views}
    assert by["random"].error == "'random' chose its tokens, but its panel could not be drawn (the server log has " \
                                 "the details)"
    assert by["random"].mask is None and by["mi"].error is None and by["similarity"].error is None
    assert sum(by["mi"].timeline.info["kept"]) == 3


@pytest.mark.parametrize("change, field", [({"budget": 0}, "budget"), ({"budget": 101}, "budget"),
                                           ({"budget": None}, "budget"), ({"unit": "tokens", "budget": 5000}, "budget"),
                                           ({"methods": []}, "methods"), ({"methods": METHODS[:MAX_PANELS + 1]},
                                                                          "methods")])
def test_a_refused_move_keeps_the_panels_and_says_why(handlers, image, change, field):
    vals = controls_for(Settings(methods=("mi", "random"), budget=0.25))
    first = handlers.live(image, vals)
    assert first.notice == gr.skip() and len(first.outputs()) == MAX_PANELS * PANEL_FIELDS + 6
    refused = handlers.live(image, {**vals, **change}, shown=first.shown, ask=4, raw=2, auto=True)
    skip = gr.skip()
    assert all(u == skip for u in refused.panels) and refused.ask == skip and refused.raw == skip  # nothing redrawn
    assert refused.shown["props"] == first.shown["props"] and refused.shown["refused"] is True
    assert refused.notice.startswith("**Not applied:** ") and field in refused.notice.lower(), refused.notice
    assert refused.notice.endswith("The panels still show the last settings that worked.")
    again = handlers.live(image, vals, shown=refused.shown)
    assert again.notice == "" and "refused" not in again.shown  # the line clears once the panels follow again
