"""The results area: status line, scored prompt tokens, reference answer, the refusal line (why the panels
did not follow the controls), the method panels, patch inspection and downloads."""
from __future__ import annotations

from dataclasses import dataclass

import gradio as gr

from . import panels as P


@dataclass
class Results:
    status: gr.Markdown
    tokens: gr.HighlightedText
    reference: gr.Markdown
    panels: list
    px: gr.Number
    py: gr.Number
    inspect: gr.Button
    patch_tokens: gr.HighlightedText
    patch_info: gr.JSON
    export: gr.Button
    files: gr.File
    view_json: gr.JSON
    answers_json: gr.JSON
    shown: gr.State  # the panels' props as this page shows them (components.page.panels.live_updates), the view's data
    # counters a view bumps to start a follow-up event by their change (a value the page compares: a
    # State's change is not reported to the page by a view outside the queue): answers (when answering
    # automatically) and the raw-data JSON (while its accordion is open); unchanged, no event at all
    ask: gr.Number
    raw: gr.Number
    raw_open: gr.State
    raw_box: gr.Accordion
    frame: gr.Slider | None = None  # a video's frame the panels show (0: all side by side)
    notice: gr.Markdown | None = None  # the refusal line over the panels: why the controls were not applied

    def view_outputs(self) -> list:
        """What a view update writes: every panel field, reference, settings box is added by the caller."""
        return [c for p in self.panels for c in p.components()]

    def answer_outputs(self) -> list:
        return [p.answer for p in self.panels]


def build_results() -> Results:
    status = gr.Markdown(elem_id="status")
    tokens = gr.HighlightedText(label="Prompt tokens scored as text: click one to see MI's PMI with it",
                                elem_id="tokens", combine_adjacent=False, show_legend=False,
                                color_map={"shown": "orange"}, interactive=False)
    reference = gr.Markdown(P.reference_md(None), elem_id="reference")
    frame = gr.Slider(0, 1, value=0, step=1, visible=False, elem_id="frame",
                      label="Frame the panels show (0: every frame, two a row; pick one to see it at full width)")
    notice = gr.Markdown("", elem_id="notice")  # over the panels: why they did not follow the controls
    panels = P.build_panels()
    with gr.Accordion("Inspect a patch (click one in any kept-patch image)", open=False):
        with gr.Row():
            px = gr.Number(label="x (pixels of the panel image)", elem_id="patch-x")
            py = gr.Number(label="y", elem_id="patch-y")
            inspect = gr.Button("Inspect", elem_id="inspect")
        patch_tokens = gr.HighlightedText(label="PMI of the patch with every prompt token", elem_id="patch-pmi")
        patch_info = gr.JSON(label="patch", elem_id="patch-info")
    with gr.Accordion("Downloads and raw data", open=False) as raw_box:
        export = gr.Button("Make PNG + JSON files", elem_id="export")
        files = gr.File(file_count="multiple", label="files", elem_id="files")
        view_json = gr.JSON(label="view (kept indices, timings)", elem_id="view-json")
        answers_json = gr.JSON(label="answers", elem_id="answers-json")
    return Results(status, tokens, reference, panels, px, py, inspect, patch_tokens, patch_info, export, files,
                   view_json, answers_json, gr.State(None), gr.Number(0, visible="hidden", elem_id="ask"),
                   gr.Number(0, visible="hidden", elem_id="raw"), gr.State(False), raw_box, frame, notice)


__all__ = ["Results", "build_results"]
