"""The method panels: one column per chosen method (mask, heatmap, pivot map, legend, answer).

A fixed number of panel slots (MAX_PANELS) is built once; a view fills the first len(methods)
slots and hides the rest, so every update has the same outputs (and one API signature).
"""
from __future__ import annotations

import html
from dataclasses import dataclass

import gradio as gr

from .logic import MAX_PANELS, label

PANEL_FIELDS = 6  # title, mask, heatmap, pivot map, legend, answer
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

    def components(self) -> list:
        return [self.title, self.mask, self.heat, self.pivot, self.legend, self.answer]


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
                        heat=gr.Image(label="scores", type="pil", format=IMAGE_FORMAT, interactive=False, visible=False, height=IMAGE_HEIGHT,
                                      elem_id=f"panel-{i}-heat", buttons=["download", "fullscreen"]),
                        pivot=gr.Image(label="pivot word of each patch", type="pil", format=IMAGE_FORMAT,
                                       interactive=False, visible=False, elem_id=f"panel-{i}-pivot", height=IMAGE_HEIGHT,
                                       buttons=["download", "fullscreen"]),
                        legend=gr.HTML(visible=False, elem_id=f"panel-{i}-legend"),
                        answer=gr.Markdown(visible=False, elem_id=f"panel-{i}-answer"),
                    ))
    return panels


def legend_html(legend: list[tuple[str, str]] | None) -> str:
    if not legend:
        return ""
    chips = "".join(f'<span style="display:inline-block;margin:2px 6px 2px 0;white-space:nowrap">'
                    f'<span style="display:inline-block;width:12px;height:12px;background:{c};'
                    f'vertical-align:middle;margin-right:3px;border:1px solid #8884"></span>{html.escape(t)}</span>'
                    for t, c in legend)
    return f'<div style="font-size:0.85em">{chips}</div>'


def answer_md(ans: dict | None, generated_hint: str) -> str:
    if ans is None:
        return f"*{generated_hint}*"
    return (f"**Answer:** {ans['text'] or '(empty)'}  \n"
            f"LLM input {ans['input_tokens']} tokens ({ans['visual_tokens']} visual) · "
            f"prefill {ans['prefill_ms']:.0f} ms · decode {ans['decode_ms']:.0f} ms ({ans['new_tokens']} tokens)")


def method_notes(sel) -> str:
    """What a method chose for this input: the lambda applied (MI's lam_rule) and an adaptive K."""
    notes = [sel.extras["lam_note"]] if "lam_note" in sel.extras else []
    if sel.extras.get("k_rule", "fixed") != "fixed":
        notes.append(f"K = {sel.budget} chosen by k_rule {sel.extras['k_rule']} (the budget caps it)")
    return "".join(f" · {n}" for n in notes)


def panel_updates(views, n_visual: int, answers: dict | None, hint: str) -> list:
    """Updates for all MAX_PANELS x PANEL_FIELDS components from the views of one slider move."""
    out = []
    answers = answers or {"methods": {}}
    for i in range(MAX_PANELS):
        if i >= len(views):
            out += [gr.update(visible=False)] * PANEL_FIELDS
            continue
        v = views[i]
        title = (f"### {label(v.method)}\n{v.kept} / {n_visual} tokens kept "
                 f"({100 * v.share:.1f}%) · prune {v.prune_ms:.1f} ms · render {v.render_ms:.1f} ms"
                 + method_notes(v.selection))
        is_mi = v.pivot is not None
        out += [gr.update(value=title, visible=True),
                gr.update(value=v.mask, visible=True),
                gr.update(value=v.heatmap, visible=True, label=v.heat_title),
                gr.update(value=v.pivot, visible=is_mi),
                gr.update(value=legend_html(v.legend), visible=is_mi),
                gr.update(value=answer_md(answers["methods"].get(v.method), hint), visible=True)]
    return out


def answer_updates(methods: list[str], answers: dict, hint: str) -> list:
    """Updates for the answer field of every panel slot (others unchanged)."""
    out = []
    for i in range(MAX_PANELS):
        if i < len(methods):
            out.append(gr.update(value=answer_md(answers["methods"].get(methods[i]), hint), visible=True))
        else:
            out.append(gr.update())
    return out


def reference_md(ans: dict | None) -> str:
    if ans is None:
        return "**Unpruned reference:** *not generated yet*"
    return ("**Unpruned reference answer:** " + (ans["text"] or "(empty)")
            + f"  \nLLM input {ans['input_tokens']} tokens ({ans['visual_tokens']} visual) · prefill "
              f"{ans['prefill_ms']:.0f} ms · decode {ans['decode_ms']:.0f} ms")


__all__ = ["PANEL_FIELDS", "Panel", "answer_md", "answer_updates", "build_panels", "legend_html",
           "panel_updates", "reference_md"]
