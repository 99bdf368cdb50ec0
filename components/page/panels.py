"""The method panels: one column per chosen method (mask, heatmap, pivot map, legend, answer).

A fixed number of panel slots (MAX_PANELS) is built once; a view fills the first len(methods)
slots and hides the rest, so every update has the same outputs (and one API signature).
"""
from __future__ import annotations

import html
from dataclasses import dataclass

import gradio as gr
from PIL import Image

from mipruner.serve.answer_time import timing_line
from mipruner.serve.service import method_spec

from ..core.logic import MAX_PANELS, label
from ..core.panel_files import IMAGES
from . import video as V

PANEL_FIELDS = 7  # title, mask, heatmap, pivot map, notes (pivot legend, "no score map"), answer, timeline (video)
# Panel images go to the page as JPEG: PNG encoding of a 336 px heatmap took 7-14 ms and of an
# 8-frame strip 66-76 ms, JPEG 0.3-3.6 ms (`python -m mipruner.bench slider` counts it); the
# downloads (Downloads accordion) are PNG.
IMAGE_FORMAT = "jpeg"
IMAGE_HEIGHT = 240  # px on the page; the image itself keeps its resolution (click coordinates use it)


@dataclass
class Panel:
    title: gr.Markdown
    mask: gr.Image
    heat: gr.Image
    pivot: gr.Image
    legend: gr.HTML
    answer: gr.Markdown
    patch: gr.HighlightedText | None = None  # the last clicked patch's PMI (not a view output: clicks fill it)
    timeline: gr.Image | None = None  # a video's tokens kept per frame (`components.page.video`)

    def components(self) -> list:
        return [self.title, self.mask, self.heat, self.pivot, self.legend, self.answer, self.timeline]


def build_panels(per_row: int = 3) -> list[Panel]:
    panels = []
    for start in range(0, MAX_PANELS, per_row):
        with gr.Row(equal_height=False):
            for i in range(start, min(start + per_row, MAX_PANELS)):
                with gr.Column(min_width=240):
                    panels.append(Panel(
                        title=gr.Markdown(visible=False, elem_id=f"panel-{i}-title"),
                        mask=gr.Image(label="kept patches (click a patch to inspect it)", type="pil", format=IMAGE_FORMAT,
                                      interactive=False, visible=False, elem_id=f"panel-{i}-mask", height=IMAGE_HEIGHT,
                                      buttons=["download", "fullscreen"]),
                        # the chart names its axes and legend itself: no label or button drawn over its bars
                        timeline=gr.Image(label=V.TIMELINE_LABEL, type="pil", format="png", interactive=False,
                                          visible=False, elem_id=f"panel-{i}-timeline", buttons=[],
                                          show_label=False),
                        heat=gr.Image(label="scores", type="pil", format=IMAGE_FORMAT, interactive=False, visible=False, height=IMAGE_HEIGHT,
                                      elem_id=f"panel-{i}-heat", buttons=["download", "fullscreen"]),
                        pivot=gr.Image(label="pivot word of each patch", type="pil", format=IMAGE_FORMAT,
                                       interactive=False, visible=False, elem_id=f"panel-{i}-pivot", height=IMAGE_HEIGHT,
                                       buttons=["download", "fullscreen"]),
                        legend=gr.HTML(visible=False, elem_id=f"panel-{i}-legend"),
                        answer=gr.Markdown(visible=False, elem_id=f"panel-{i}-answer"),
                        patch=gr.HighlightedText(visible=False, elem_id=f"panel-{i}-patch", show_legend=False,
                                                 interactive=False, label="clicked patch"),
                    ))
    return panels


def patch_beside(tokens, x, y):
    """The clicked panel's patch box: the patch's PMI with each prompt token (scaled 0-1), shown."""
    if not tokens:
        return gr.update(visible=False)
    tokens = [(t["token"], t.get("class_or_confidence")) if isinstance(t, dict) else tuple(t) for t in tokens]
    where = f" at ({x:.0f}, {y:.0f})" if isinstance(x, (int, float)) and isinstance(y, (int, float)) else ""
    return gr.update(visible=True, value=tokens, label=f"clicked patch{where}: its PMI with each prompt token")


def cleared_patches() -> list:
    """Updates that forget the last clicks (a new encoding: its patches are not the old picture's): every
    panel's clicked-patch box hidden and emptied, then the Inspect section's x, y, PMI and patch info emptied."""
    return [gr.update(visible=False, value=None) for _ in range(MAX_PANELS)] + [None] * 4


LEGEND_CHIPS = 12  # a legend shows this many entries, then says how many more (pool: one per kept patch)


def legend_html(legend: list[tuple[str, str]] | None, cap: int = LEGEND_CHIPS) -> str:
    """The colour legend under a panel: its first `cap` entries as chips, then how many it leaves out."""
    if not legend:
        return ""
    more = len(legend) - cap if len(legend) > cap + 1 else 0
    legend = legend[:cap] if more else legend
    chips = "".join(f'<span style="display:inline-block;margin:2px 6px 2px 0;white-space:nowrap">'
                    f'<span style="display:inline-block;width:12px;height:12px;background:{c};'
                    f'vertical-align:middle;margin-right:3px;border:1px solid #8884"></span>{html.escape(t)}</span>'
                    for t, c in legend)
    if more:
        chips += f'<span style="white-space:nowrap"><i>and {more} more (the picture shows every colour)</i></span>'
    return f'<div style="font-size:0.85em">{chips}</div>'


def answer_md(ans: dict | None, generated_hint: str, partial: str | None = None) -> str:
    """An answer's Markdown: the answer with its sizes and its own time, its failure, the text decoded so far
    (`partial`, while it streams), or the hint of how it comes."""
    if ans is None and partial is not None:
        return f"**Answer** *(generating)*: {partial}"
    if ans is None:
        return f"*{generated_hint}*"
    if "error" in ans:
        return f"**No answer:** {ans['error']}"
    decoding = "" if "decode_visual" not in ans else (
        f" · decoding: {ans['decode_visual']} of {ans['visual_tokens']} visual keys read per step from layer "
        f"{ans['decode_layer']}")
    return (f"**Answer:** {ans['text'] or '(empty)'}  \n"
            f"LLM input {ans['input_tokens']} tokens ({ans['visual_tokens']} visual) · "
            f"{timing_line(ans)} ({ans['new_tokens']} tokens){decoding}")


def method_notes(sel) -> str:
    """What a method chose for this input: the lambda applied (MI's lam_rule), an adaptive K, a
    withdrawal of every visual token, and the prefill compute of the selection."""
    notes = [sel.extras["lam_note"]] if "lam_note" in sel.extras else []
    if "k_note" in sel.extras:  # the method says what set its K (EVS: its rate and the budget)
        notes.append(sel.extras["k_note"])
    elif sel.extras.get("k_rule", "fixed") != "fixed":
        notes.append(f"K = {sel.budget} chosen by k_rule {sel.extras['k_rule']} (the budget caps it)")
    elif "k_rule" not in sel.extras and sel.method and method_spec(sel.method).adaptive:
        notes.append(f"K = {sel.budget} chosen per input (the budget caps it)")
    if sel.extras.get("withdrawn_at") is not None:  # an in-LLM stage kept no visual token
        notes.append(f"all withdrawn from layer {sel.extras['withdrawn_at']}")
    if sel.extras.get("compute") is not None:  # `mipruner.measure.compute`: the prefill compute it implies
        notes.append(sel.extras["compute"].text())
    return "".join(f" · {n}" for n in notes)


def heat_field(v) -> tuple[dict, Image.Image | None, str | None]:
    """(props, image, note) of a panel's heatmap: the map with its colour bar, labelled with the
    quantity and unit (the method's registered `score_label`, or PMI with the clicked word); a
    method whose scores mean nothing (score_label None) gets no map and a note saying so."""
    spec = method_spec(v.method)
    pmi = v.heatmap.info.get("label") if v.heatmap is not None else None  # a PMI map names its word
    if pmi is None and spec.score_label is None:
        return {"visible": False}, None, (f"<i>{html.escape(spec.label)} has no score map: "
                                          "its picks follow no per-patch score.</i>")
    bar = pmi or spec.score_label
    return {"visible": True, "label": pmi or f"scores: {bar}"}, IMAGES.with_colorbar(v.heatmap, bar), None


def panel_fields(views, n_visual: int, answers: dict | None, hint: str, *,
                 video: bool = False) -> list[tuple[dict, object]]:
    """(props, value) of all MAX_PANELS x PANEL_FIELDS components for the views of one slider move;
    props are what a value alone cannot change (visibility, label, a video's picture height)."""
    sized = V.picture_props(video, IMAGE_HEIGHT)
    out: list[tuple[dict, object]] = []
    answers = answers or {"methods": {}}
    hidden = ({"visible": False}, None)
    for i in range(MAX_PANELS):
        if i >= len(views):
            out += [hidden] * PANEL_FIELDS
            continue
        v = views[i]
        if v.error is not None:  # this method failed on this input: its panel says why, the others render
            out += [({"visible": True}, f"### {label(v.method)}\n**Failed on this input:** {v.error}"),
                    *[hidden] * (PANEL_FIELDS - 1)]
            continue
        title = (f"### {label(v.method)}\n{v.kept} / {n_visual} tokens kept "
                 f"({100 * v.share:.1f}%) · prune {v.prune_ms:.1f} ms · render {v.render_ms:.1f} ms"
                 + method_notes(v.selection))
        heat_props, heat, note = heat_field(v)
        heat_props = {**heat_props, **sized} if heat_props.get("visible") else heat_props
        is_mi = v.pivot is not None
        notes = legend_html(v.legend) if is_mi else ""
        if note:
            notes = f'<div style="font-size:0.85em">{note}</div>' + notes
        out += [({"visible": True}, title),
                ({"visible": True, **sized}, v.mask),
                (heat_props, heat),
                ({"visible": is_mi, **({"label": "merged into (colour: the kept patch each dropped one went into)",
                                         **sized} if is_mi and v.selection.pmi is None else
                                       {"label": "pivot word of each patch", **sized} if is_mi else {})},
                 v.pivot if is_mi else None),
                ({"visible": bool(notes)}, notes),
                ({"visible": True}, answer_md(answers["methods"].get(v.method), hint)),
                V.timeline_field(v)]
    return out


def panel_updates(fields: list[tuple[dict, object]]) -> list:
    """Full updates (props and value) of `panel_fields` (the /view API)."""
    return [gr.update(value=value, **props) if props.get("visible") else gr.update(**props) for props, value in fields]


def live_updates(fields: list[tuple[dict, object]], shown: list | None) -> tuple[list, list]:
    """The page's updates for `fields` given what it `shown` (the last call's props), and the new
    record. Gradio rebuilds a component's whole config for any prop update, even an empty one
    (gr.skip()): a few ms each, tens for a page of panels. So props go out only where they changed,
    elsewhere the bare value (None for a hidden component)."""
    out = []
    for i, (props, value) in enumerate(fields):
        same = shown is not None and i < len(shown) and shown[i] == props
        if not same:
            out.append(gr.update(value=value, **props) if props.get("visible") else gr.update(**props))
        else:
            out.append(value if props.get("visible") else None)
    return out, [props for props, _ in fields]


def answer_updates(methods: list[str], answers: dict, hint: str, *, bare: bool = False,
                   partial: dict | None = None) -> list:
    """Updates for the answer field of every panel slot (others unchanged). bare: values only (None
    in unused, hidden slots), for a page whose view already shows these panels: no prop update.
    partial: the text so far of answers still decoding, by method."""
    out = []
    for i in range(MAX_PANELS):
        if i < len(methods):
            md = answer_md(answers["methods"].get(methods[i]), hint, (partial or {}).get(methods[i]))
            out.append(md if bare else gr.update(value=md, visible=True))
        else:
            out.append(None if bare else gr.update())
    return out


def reference_md(ans: dict | None, partial: str | None = None) -> str:
    if ans is None and partial is not None:
        return f"**Unpruned reference answer** *(generating)*: {partial}"
    if ans is None:
        return "**Unpruned reference:** *not generated yet*"
    if "error" in ans:
        return f"**Unpruned reference:** {ans['error']}"
    return ("**Unpruned reference answer:** " + (ans["text"] or "(empty)")
            + f"  \nLLM input {ans['input_tokens']} tokens ({ans['visual_tokens']} visual) · {timing_line(ans)}")


__all__ = ["LEGEND_CHIPS", "PANEL_FIELDS", "Panel", "answer_md", "answer_updates", "build_panels", "cleared_patches", "heat_field",
           "legend_html", "live_updates", "panel_fields", "panel_updates", "patch_beside", "reference_md"]
