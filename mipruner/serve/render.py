"""One method's panel, drawn from its selection: the kept mask, a heatmap (the method's scores, an MI
method's PMI with one prompt token, or a temporal method's dissimilarity between frames) and the
pivot-word map (MI methods) or the merge map (merging methods), and for a video the tokens kept per
frame (`viz_video.timeline`); or, when the method failed on this input, its one sentence
(`failed_view`). Maps that follow the scores alone are redrawn only when their values change
(`drawn`, the encoding's drawing cache), so a budget move redraws the mask (and a video's timeline) only.
The engine prunes; this module only draws.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

from PIL import Image

from .. import viz
from ..pruners import Selection
from ..viz import video as viz_video
from .failures import drawing


@dataclass
class MethodView:
    """What one method panel shows after a slider move."""

    method: str
    label: str
    selection: Selection | None  # None when the method failed (`error`)
    kept: int
    share: float  # kept / N_V
    prune_ms: float
    render_ms: float
    mask: Image.Image | None
    heatmap: Image.Image | None  # PMI with `heat_token` for MI methods when given, else the method's scores
    heat_title: str
    pivot: Image.Image | None = None  # MI methods: pivot words; merging methods: `viz.merge_map`
    legend: list[tuple[str, str]] | None = None
    error: str | None = None  # one sentence when this method raised or broke the contract on this input
    timeline: Image.Image | None = None  # a video: the tokens kept per frame (`viz_video.timeline`)


def render_view(enc, sel: Selection, layout: viz.Layout, drawn: Callable[[Any, Any, Callable], Any], *,
                method: str, label: str, heat_token: int | None, prune_ms: float) -> MethodView:
    """The panel of method `method` (shown as `label`) for selection `sel` of encoding `enc`.

    drawn(key, values, draw): `draw()`, or the drawing made last under `key` from equal `values`
    (`CachedEncoding.drawn`); keys are per label, so two panels of one method keep their own maps.
    heat_token: a scoring-text token index for the MI methods' PMI heatmap (None: the scores). A drawing that
    fails is a `failures.DrawingError`: it costs this panel only (`engine.view` shows its sentence)."""
    with drawing(method):
        return _draw(enc, sel, layout, drawn, method=method, label=label, heat_token=heat_token, prune_ms=prune_ms)


def _draw(enc, sel: Selection, layout: viz.Layout, drawn: Callable[[Any, Any, Callable], Any], *,
          method: str, label: str, heat_token: int | None, prune_ms: float) -> MethodView:
    t0 = time.perf_counter()
    mask = viz.kept_mask(enc, sel, layout=layout)
    pivot = legend = None
    if sel.pmi is not None and sel.pivot is not None:
        pivot, legend = drawn(("pivot", label), sel.pivot, lambda: viz.pivot_map(enc, sel, layout=layout))
    elif sel.merged_into is not None:  # a merging method: which dropped patch went into which kept one
        pivot, legend = viz.merge_map(enc, sel, layout=layout)
    temporal = viz_video.temporal_values(enc, sel)
    if temporal is not None:  # EVS: its temporal dissimilarity over every frame (frame 0: no value, kept)
        heat = drawn(("temporal", label), temporal.nan_to_num(-1.0),  # NaN != NaN: compared with a sentinel
                     lambda: viz_video.dissimilarity_heatmap(enc, temporal, layout=layout))
        title = viz_video.DISSIMILARITY_LABEL
    elif heat_token is not None and sel.pmi is not None:
        heat = drawn(("pmi", label, heat_token), sel.pmi[:, heat_token],
                     lambda: viz.pmi_heatmap(enc, sel, heat_token, layout=layout))
        title = f"PMI with {enc.scoring_tokens[heat_token]!r}"
    else:
        heat = drawn(("scores", label), sel.scores, lambda: viz.scores_heatmap(enc, sel.scores, layout=layout))
        title = f"{method} scores"
    return MethodView(method=method, label=label, selection=sel, kept=sel.budget, share=sel.budget / enc.n_visual,
                      prune_ms=prune_ms, render_ms=(time.perf_counter() - t0) * 1e3, mask=mask, heatmap=heat,
                      heat_title=title, pivot=pivot, legend=legend,
                      timeline=viz_video.timeline(enc, sel) if viz_video.is_video(enc) else None)


def failed_view(method: str, label: str, error: str) -> MethodView:
    """The panel of a method that failed on this input: its sentence, no selection, no images."""
    return MethodView(method=method, label=label, selection=None, kept=0, share=0.0, prune_ms=0.0, render_ms=0.0,
                      mask=None, heatmap=None, heat_title="", error=error)


__all__ = ["MethodView", "failed_view", "render_view"]
