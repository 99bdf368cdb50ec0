"""The page: inputs, controls, method panels, answers, inspection, downloads; and its API.

API endpoints (each usable from `gradio_client`, one per action; the page chains them):
  /encode     (model, use, image, video, prompt, text_mode) -> status, prompt tokens
  /view       (controls...) -> panels, reference answer, settings string, view JSON
  /generate   (controls..., max_new_tokens) -> answers (panels' answer fields + JSON)
  /inspect    (controls..., x, y) -> PMI of the patch under (x, y) with every prompt token
  /export     (controls...) -> PNG + JSON files
  /settings   (settings string) -> the controls set to it
Per-session state lives in one `gr.State` (a `components.core.logic.UIState`); the sessions that encoded are
also kept by the app (`components.core.kept`), so a flood of new sessions in Gradio's own store evicts none of them.
Each area is built by its own module (inputs, controls, results) and `events.wire` connects them.
"""
from __future__ import annotations

import os

import gradio as gr

from ..core.kept import Kept
from ..core.logic import AppLogic
from ..core.sweep_queue import SweepLimits
from ..core.views import fewer_by_default
from . import controls as C
from .events import wire
from .inputs import build_inputs
from .results import build_results
from .style import LAYOUT_CSS, PAGE_JS
from .sweep import build_sweep

STATE_TTL_S = 1800  # a session's state (its encodings) is dropped after 30 min without use

INTRO = """# mipruner: visual-token pruning, side by side
Upload an image or a video, ask a question, press **Run**. The model encodes once; every slider
then re-runs only pruning and drawing. Each panel shows which patches a method keeps (dropped ones
are dimmed), a heatmap (its scores, or MI's PMI with the prompt word you click), and for MI-Pruner
the *pivot word* of every patch: the prompt token it is most related to."""


CONTROLS_HINT = "**Controls**: scroll this sheet down for every control, the page above it for the panels."


def build_demo(logic: AppLogic, *, auto_answers: bool = True, sweep_limits: SweepLimits | None = None,
               max_sessions: int = 1000) -> gr.Blocks:
    """The Blocks app around `logic` (shared by all sessions; per-session state in gr.State). sweep_limits: the
    bounds on a visitor's sweep (`SweepLimits.for_server`: small and timed when hosted; default: local).
    max_sessions: the encoded sessions the app keeps itself (`components.core.kept`), whatever Gradio drops."""
    # delete_cache: files Gradio wrote for this app (panel images, downloads) older than 2 h go, hourly
    with gr.Blocks(title="mipruner: MI-Pruner explorer", delete_cache=(3600, 7200), fill_width=True) as demo:
        state = gr.State(None, time_to_live=STATE_TTL_S)
        gr.Markdown(INTRO)
        with gr.Row(equal_height=False, elem_id="layout"):  # placed by LAYOUT_CSS
            with gr.Column(scale=1, elem_id="inputs-col"):
                inp = build_inputs(logic.hub, fewer_by_default(logic.hub))
                warm_status(demo, logic.warm)
            with gr.Column(scale=1, elem_id="controls-col"):
                gr.Markdown(CONTROLS_HINT, elem_id="controls-hint")  # shown on phones only (LAYOUT_CSS)
                ctl = C.build_controls()
                act = C.build_actions(logic.max_new_tokens, auto_answers)
            with gr.Column(elem_id="results-col"):
                res = build_results()
        wire(logic, state, inp, ctl, act, res, auto_answers=auto_answers, kept=Kept(max_sessions, STATE_TTL_S))
        build_sweep(logic, state, inp, ctl, sweep_limits)
    return demo


def warm_status(demo: gr.Blocks, warm) -> None:
    """The compiled path's warm-up on the page (components.core.warmup): a status line read at each page load
    and every second while it warms (a timer, stopped once it is done; both events private: not in the
    API); nothing when it is off."""
    if warm is None:
        return
    line = gr.Markdown(warm.message, elem_id="warm-status")
    timer = gr.Timer(1.0, active=warm.warming)
    now = dict(queue=False, show_progress="hidden", api_visibility="private")
    demo.load(lambda: (warm.message, gr.Timer(active=warm.warming)), None, [line, timer], **now)
    timer.tick(lambda: (warm.message, gr.Timer(active=warm.warming)), None, [line, timer], **now)


def launch_kwargs(max_file_size: str = "50mb") -> dict:
    """What `launch` needs: upload size limit, only assets/ served besides uploads, the page's CSS and script
    (`components.page.style`)."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return {"max_file_size": max_file_size, "allowed_paths": [os.path.join(root, "assets")], "css": LAYOUT_CSS,
            "js": PAGE_JS}


__all__ = ["LAYOUT_CSS", "build_demo", "launch_kwargs", "warm_status"]
