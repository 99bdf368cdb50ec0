"""A video on the page: its frames in a grid that can be read, one frame picked at full width, a click
mapped back through either, the tokens kept per frame under each panel, and the video-only controls (shown for a video only).

The drawing is the library's (`mipruner.viz.video`: the grid layout, the timeline, the dissimilarity
map); this module only decides how the page shows it. Panel images are `gr.Image`s, which never enlarge
a picture past its own size (`object-fit: scale-down`) and fit it in the component's height: a video's
images therefore take the panel's width at their own height ("auto"), and a picked frame is enlarged
`zoom_of` times (nearest: the patches stay sharp) so it can fill a panel.
"""
from __future__ import annotations

import math

import gradio as gr

from mipruner.viz.video import video_params

from ..core.logic import UIState
from ..core.panel_files import IMAGES

FRAME_PX = 640  # a picked frame is enlarged to at least this width, so it fills a panel
TIMELINE_LABEL = "tokens kept per frame"


def zoom_of(box: tuple[int, int, int, int]) -> int:
    """The whole factor a picked frame of `box` (x0, y0, x1, y1) is enlarged by on the page."""
    return max(1, math.ceil(FRAME_PX / max(1, box[2] - box[0])))


def show_frame(views, box: tuple[int, int, int, int]) -> None:
    """Cut every view's pictures to one frame (`box` in the grid's pixels), enlarged `zoom_of(box)` times."""
    z = zoom_of(box)
    for v in views:
        for name in ("mask", "heatmap", "pivot"):
            img = getattr(v, name, None)
            if img is not None:
                setattr(v, name, IMAGES.cropped(img, box, z))


def grid_point(box: tuple[int, int, int, int] | None, x: float, y: float) -> tuple[float, float]:
    """A click on a panel's picture -> the pixel of the whole grid: as it is when every frame is shown
    (box None), else inside the picked frame's `box`, undoing its enlargement."""
    if box is None:
        return x, y
    z = zoom_of(box)
    return box[0] + x / z, box[1] + y / z


def picture_props(video: bool, image_height: int) -> dict:
    """The panel pictures' height: an image's `image_height` px, a video's the picture's own (at the panel's
    width)."""
    return {"height": "auto" if video else image_height}


def timeline_field(view) -> tuple[dict, object]:
    """(props, value) of a panel's timeline: shown for a video (`MethodView.timeline`), hidden otherwise."""
    if getattr(view, "timeline", None) is None:
        return {"visible": False}, None
    return {"visible": True}, view.timeline


def build_video_controls(params: dict, widget) -> tuple[gr.Column, dict]:
    """The video-only parameters (`mipruner.viz.video.video_params`: EVS's rate, the per-frame budget split) in a
    group of their own under the budget, hidden until a video is encoded (`shown_for`). params: every
    parameter by name; widget(p): its control (`controls.param_widget`). Returns the group and
    {name: widget}; they feed the page's controls like every other parameter (live, in the settings string)."""
    names = [n for n in video_params() if n in params]
    with gr.Column(visible=False, elem_id="video-controls") as group:
        gr.Markdown("**Video**: how the budget is shared over time (shown for a video only)")
        widgets = {n: widget(params[n]) for n in names}
    return group, widgets


def shown_for(st) -> dict:
    """The video group's update for the session's encoding: shown for a video of several frames."""
    return gr.update(visible=isinstance(st, UIState) and st.n_frames > 1)


__all__ = ["FRAME_PX", "TIMELINE_LABEL", "grid_point", "picture_props", "show_frame",
           "timeline_field", "zoom_of", "build_video_controls", "shown_for"]
