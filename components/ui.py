"""The page: inputs, controls, method panels, answers, inspection, downloads; and its API.

API endpoints (each usable from `gradio_client`, one per action; the page chains them):
  /encode     (model, use, image, video, prompt, text_mode) -> status, prompt tokens
  /view       (controls...) -> panels, reference answer, settings string, view JSON
  /generate   (controls..., max_new_tokens) -> answers (panels' answer fields + JSON)
  /inspect    (controls..., x, y) -> PMI of the patch under (x, y) with every prompt token
  /export     (controls...) -> PNG + JSON files
  /settings   (settings string) -> the controls set to it
Per-session state lives in one `gr.State` (a `components.logic.UIState`); nothing else is stored.
"""
from __future__ import annotations

import inspect
import os
import tempfile

import gradio as gr


from . import controls as C
from . import panels as P
from .examples import load_examples
from .logic import MAX_PANELS, AppLogic, UIState, UserError
from .settings import Settings

STATE_TTL_S = 1800  # a session's state (its encodings) is dropped after 30 min without use

INTRO = """# mipruner: visual-token pruning, side by side
Upload an image or a video, ask a question, press **Run**. The model encodes once; every slider
then re-runs only pruning and drawing. Each panel shows which patches a method keeps (dropped ones
are dimmed), a heatmap (its scores, or MI's PMI with the prompt word you click), and for MI-Pruner
the *pivot word* of every patch: the prompt token it is most related to."""


def _error(e: Exception):
    raise gr.Error(str(e), print_exception=False)


def token_chips(tokens: list[str], heat: int) -> list[tuple[str, str | None]]:
    """The prompt's scored tokens for the clickable HighlightedText (the heatmap's token marked)."""
    return [(t.replace("\u2581", "").replace("\u0120", "") + " ", "shown" if i == heat else None)
            for i, t in enumerate(tokens)]


def named(*names: str, extra: tuple = ()):
    """Give a `*vals` handler a signature with these parameter names, so the API (and
    `gradio_client`'s view_api) shows readable names instead of param_1, param_2, ..."""
    def wrap(fn):
        params = [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in names]
        params += list(extra)
        fn.__signature__ = inspect.Signature(params)
        return fn

    return wrap


def build_demo(logic: AppLogic, *, auto_answers: bool = True) -> gr.Blocks:
    """The Blocks app around `logic` (shared by all sessions; per-session state in gr.State)."""
    hub = logic.hub
    examples = load_examples()
    # delete_cache: files Gradio wrote for this app (panel images, downloads) older than 2 h go, hourly
    with gr.Blocks(title="mipruner: MI-Pruner explorer", delete_cache=(3600, 7200)) as demo:
        state = gr.State(None, time_to_live=STATE_TTL_S)
        gr.Markdown(INTRO)
        with gr.Row(equal_height=False):
            with gr.Column(scale=1):
                model = gr.Dropdown(hub.choices(), value=hub.default, allow_custom_value=True, elem_id="model",
                                    label="Model")
                model_path = gr.Textbox(label="...or a model id / local path (used instead of the list when given)",
                                        placeholder="e.g. llava-hf/llava-1.5-7b-hf or /models/my-llava",
                                        elem_id="model-path")
                gr.Markdown(hub.startup_message or "", elem_id="model-status")
                with gr.Tabs():
                    with gr.Tab("Image"):
                        image = gr.Image(type="filepath", sources=["upload", "clipboard", "webcam"], label="Image",
                                         elem_id="image", height=300)
                    with gr.Tab("Video"):
                        video = gr.Video(sources=["upload"], label="Video (a few frames are sampled)", elem_id="video",
                                         height=300)
                use = gr.Radio(["image", "video"], value="image", label="Use", elem_id="use")
                prompt = gr.Textbox(label="Prompt", placeholder="Ask a question about the image or video",
                                    elem_id="prompt", lines=2)
                run = gr.Button("Run", variant="primary", elem_id="run")
                if examples:
                    gr.Examples([[e["path"] if e["kind"] == "image" else None,
                                  e["path"] if e["kind"] == "video" else None, e["prompt"], e["kind"]]
                                 for e in examples], inputs=[image, video, prompt, use],
                                label="Examples (generated scenes and a clip; the embedded model knows these shapes)")
            with gr.Column(scale=1):
                ctl = C.build_controls()
                with gr.Row():
                    auto = gr.Checkbox(value=auto_answers, elem_id="auto-answers",
                                       label="Answer automatically after every change (cheap on the embedded "
                                             "model; on large models untick and press Generate)")
                    max_new = gr.Number(value=logic.max_new_tokens, precision=0, minimum=1, maximum=512,
                                        label="Max new tokens", elem_id="max-new-tokens")
                generate = gr.Button("Generate answers", elem_id="generate")
                with gr.Row():
                    settings_box = gr.Textbox(label="Settings string (copy to reproduce this view; paste + Apply)",
                                              elem_id="settings", scale=4)
                    apply = gr.Button("Apply", scale=1, elem_id="apply")
        status = gr.Markdown(elem_id="status")
        tokens = gr.HighlightedText(label="Prompt tokens scored as text: click one to see MI's PMI with it",
                                    elem_id="tokens", combine_adjacent=False, show_legend=False,
                                    color_map={"shown": "orange"}, interactive=False)
        reference = gr.Markdown(P.reference_md(None), elem_id="reference")
        panels = P.build_panels()
        panel_outs = [c for p in panels for c in p.components()]
        answer_outs = [p.answer for p in panels]
        with gr.Accordion("Inspect a patch (click one in any kept-patch image)", open=False):
            with gr.Row():
                px = gr.Number(label="x (pixels of the panel image)", elem_id="patch-x")
                py = gr.Number(label="y", elem_id="patch-y")
                inspect_btn = gr.Button("Inspect", elem_id="inspect")
            patch_tokens = gr.HighlightedText(label="PMI of the patch with every prompt token", elem_id="patch-pmi")
            patch_info = gr.JSON(label="patch", elem_id="patch-info")
        with gr.Accordion("Downloads and raw data", open=False):
            export_btn = gr.Button("Make PNG + JSON files", elem_id="export")
            files = gr.File(file_count="multiple", label="files", elem_id="files")
            view_json = gr.JSON(label="view (kept indices, timings)", elem_id="view-json")
            answers_json = gr.JSON(label="answers", elem_id="answers-json")

        inputs = ctl.inputs()
        # decoder-layer parameters (the in-LLM methods' K) get the model's depth as their maximum
        layer_names = [n for n in ctl.params if n == "layer"]
        layer_ctls = [ctl.params[n] for n in layer_names]

        def layer_updates(st, vals):
            if not st.n_layers:
                return [gr.update() for _ in layer_names]
            return [gr.update(maximum=st.n_layers, value=min(int(vals[names.index(n)] or 1), st.n_layers))
                    for n in layer_names]
        hint = "press Generate answers" if not auto_answers else "answers follow (or press Generate answers)"

        names = C.control_names()
        n_ctl = len(names)
        progress_param = (inspect.Parameter("progress", inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                            default=gr.Progress()),)

        def settings_of(st: UIState, vals) -> Settings:
            return C.settings_from(*vals, n_visual=st.n_visual if isinstance(st, UIState) else 0)

        # -- handlers ----------------------------------------------------------------------------
        # Each takes positional values in the order of its inputs (state first); `named` gives it
        # the API's parameter names. Gradio injects gr.Progress positionally, as the last argument.

        @named("state", "model", "model_path", "use", "image", "video", "prompt", *names, extra=progress_param)
        def on_encode(st, model_name, path, kind, img, vid, text, *rest):
            vals, progress = rest[:n_ctl], rest[n_ctl]
            model_name = (path or "").strip() or model_name
            progress(0.1, desc=f"loading {model_name}" if model_name not in hub.loaded else
                     "encoding (vision tower + prompt)")
            try:
                st, msg = logic.encode(st, model_name, kind, img, vid, text, text_mode=vals[names.index("text_mode")])
            except UserError as e:
                _error(e)
            progress(1.0, desc="encoded")
            unit, budget, heat = (vals[names.index(n)] for n in ("unit", "budget", "heat"))
            heat = int(heat) if heat is not None and -1 <= int(heat) < len(st.tokens) else -1
            return (st, msg, token_chips(st.tokens, -1),
                    C.budget_slider(unit, st.n_visual, budget if unit == "%" else None), gr.update(value=heat),
                    *layer_updates(st, vals))

        @named("state", *names)
        def on_view(st, *vals):
            try:
                s = settings_of(st, vals)
                views, summary = logic.view(st, s)
                cached = logic.cached_answers(st, s)
            except UserError as e:
                _error(e)
            toks = token_chips(st.tokens, s.heat)
            return (*P.panel_updates(views, st.n_visual, cached, hint), P.reference_md(cached["reference"]),
                    s.to_string(), summary, toks)

        def generate_answers(st, vals, n_new, progress):
            try:
                s = settings_of(st, vals)
                ans = logic.generate(st, s, int(n_new or logic.max_new_tokens), progress=progress)
            except UserError as e:
                _error(e)
            return (*P.answer_updates(list(s.methods), ans, hint), P.reference_md(ans["reference"]), ans)

        @named("state", *names, "max_new_tokens", extra=progress_param)
        def on_generate(st, *rest):
            return generate_answers(st, rest[:n_ctl], rest[n_ctl], rest[n_ctl + 1])

        @named("state", "auto", *names, "max_new_tokens", extra=progress_param)
        def on_auto(st, flag, *rest):
            if not flag or not isinstance(st, UIState) or st.key is None:
                return (*[gr.update()] * MAX_PANELS, gr.update(), gr.update())
            return generate_answers(st, rest[:n_ctl], rest[n_ctl], rest[n_ctl + 1])

        @named("state", *names, "x", "y")
        def on_inspect(st, *rest):
            vals, (x, y) = rest[:n_ctl], rest[n_ctl:]
            try:
                s = settings_of(st, vals)
                if x is None or y is None:
                    raise UserError("give the x and y of a patch (or click one)")
                info = logic.inspect(st, s, float(x), float(y))
            except UserError as e:
                _error(e)
            pmi = [v for _, v in info["pmi"]]
            lo, hi = min(pmi), max(pmi)
            scaled = [(t, round((v - lo) / (hi - lo), 3) if hi > lo else 0.5) for t, v in info["pmi"]]
            return scaled, info

        def on_click(evt: gr.SelectData):
            x, y = evt.index
            return x, y

        def on_token(st, evt: gr.SelectData):
            idx = evt.index if isinstance(evt.index, int) else evt.index[0]
            return idx if isinstance(st, UIState) and 0 <= idx < len(st.tokens) else -1

        @named("state", *names)
        def on_export(st, *vals):
            try:
                s = settings_of(st, vals)
                return logic.export(st, s, tempfile.mkdtemp(prefix="mipruner-"))
            except UserError as e:
                _error(e)

        def on_apply(st, settings):
            try:
                s = Settings.parse(settings or "")
            except ValueError as e:
                _error(e)
            n_v = st.n_visual if isinstance(st, UIState) else 0
            vals = C.control_values(s, n_v)
            unit, budget = vals[1], vals[2]
            return (*vals[:2], C.budget_slider(unit, n_v, budget), *vals[3:])

        def on_unit(st, unit):
            return C.budget_slider(unit, st.n_visual if isinstance(st, UIState) else 0)

        # -- wiring ------------------------------------------------------------------------------
        view_outs = [*panel_outs, reference, settings_box, view_json, tokens]
        gen_outs = [*answer_outs, reference, answers_json]
        live = dict(trigger_mode="always_last", show_progress="hidden")

        enc = run.click(on_encode, [state, model, model_path, use, image, video, prompt, *inputs],
                        [state, status, tokens, ctl.budget, ctl.heat, *layer_ctls], api_name="encode",
                        concurrency_limit=1)
        prompt.submit(on_encode, [state, model, model_path, use, image, video, prompt, *inputs],
                      [state, status, tokens, ctl.budget, ctl.heat, *layer_ctls], api_visibility="private",
                      concurrency_limit=1).then(
            on_view, [state, *inputs], view_outs, api_visibility="private").then(
            on_auto, [state, auto, *inputs, max_new], gen_outs, api_visibility="private")
        enc.then(on_view, [state, *inputs], view_outs, api_visibility="private").then(
            on_auto, [state, auto, *inputs, max_new], gen_outs, api_visibility="private")
        gr.Button("view", visible=False).click(on_view, [state, *inputs], view_outs, api_name="view")
        generate.click(on_generate, [state, *inputs, max_new], gen_outs, api_name="generate", concurrency_limit=1)
        for c in ctl.live():
            c.change(on_view, [state, *inputs], view_outs, api_visibility="private", **live).then(
                on_auto, [state, auto, *inputs, max_new], gen_outs, api_visibility="private", **live)
        ctl.unit.change(on_unit, [state, ctl.unit], [ctl.budget], api_visibility="private")
        image.upload(lambda: "image", None, use, api_visibility="private")
        video.upload(lambda: "video", None, use, api_visibility="private")
        tokens.select(on_token, [state], ctl.heat, api_visibility="private")
        for p in panels:
            p.mask.select(on_click, None, [px, py], api_visibility="private").then(
                on_inspect, [state, *inputs, px, py], [patch_tokens, patch_info], api_visibility="private")
        inspect_btn.click(on_inspect, [state, *inputs, px, py], [patch_tokens, patch_info], api_name="inspect")
        export_btn.click(on_export, [state, *inputs], files, api_name="export")
        apply.click(on_apply, [state, settings_box], inputs, api_name="settings")
    return demo


def launch_kwargs(max_file_size: str = "50mb") -> dict:
    """What `launch` needs for uploads and file serving: size limit, only assets/ besides uploads."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return {"max_file_size": max_file_size, "allowed_paths": [os.path.join(root, "assets")]}


__all__ = ["build_demo", "launch_kwargs"]
