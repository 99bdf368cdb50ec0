"""What each widget does: the handlers (thin wrappers over `components.logic`) and their wiring.

Each handler takes positional values in the order of its inputs (state first); `named` gives it
the API's parameter names. Gradio injects gr.Progress positionally, as the last argument.
"""
from __future__ import annotations

import inspect

import gradio as gr

from mipruner.engine import parameters

from . import controls as C
from . import panels as P
from .guards import guard_inputs, plain_errors
from .logic import MAX_PANELS, AppLogic, UIState, UserError, check_methods
from .messages import plain
from .panel_files import prepared
from .settings import Settings


# Runs in the page before the answers' event: waits (at most 0.5 s) until the panels' images have
# loaded, so the server sends the new masks before it starts the LLM (which would slow their serving)
# and the page draws them before it handles a second event.
AFTER_IMAGES_JS = """async () => {
  const t0 = performance.now();
  const loading = () => Array.from(document.querySelectorAll('[id^="panel-"] img')).some((i) => !i.complete);
  while (loading() && performance.now() - t0 < 500) await new Promise((r) => requestAnimationFrame(r));
}"""


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


def wire(logic: AppLogic, state: gr.State, inp, ctl: C.Controls, act: C.Actions, res, *, auto_answers: bool) -> None:
    """Connect the widgets of one page (`inp`: Inputs, `res`: Results) to the handlers."""
    hub = logic.hub
    # the API's controls: the page's, but for the budget a number box without bounds (the slider's range is
    # the last encoding's unit and size; `budget_of` checks the value against the unit sent with it)
    api_budget = gr.Number(None, visible=False, label="budget", elem_id="api-budget")
    inputs = [api_budget if c is ctl.budget else c for c in ctl.inputs()]
    names = C.control_names()
    n_ctl = len(names)
    hint = "press Generate answers" if not auto_answers else "answers follow (or press Generate answers)"
    progress_param = (inspect.Parameter("progress", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=gr.Progress()),)
    # decoder-layer parameters (the in-LLM methods' K) get the model's depth as their maximum
    layer_names = [n for n in ctl.params if n == "layer"]
    layer_ctls = [ctl.params[n] for n in layer_names]
    enc_names = ("model", "model_path", "use", "image", "video", "prompt")  # the API's names of encode_inputs()
    guard_inputs({**dict(zip(enc_names, inp.encode_inputs())),
                  **dict(zip(names, inputs)), "auto": act.auto, "max_new_tokens": act.max_new,
                  "settings": act.settings, "x": res.px, "y": res.py})

    def settings_of(st: UIState, vals) -> Settings:
        return C.settings_from(*vals, n_visual=st.n_visual if isinstance(st, UIState) else 0)

    def layer_updates(st, vals):
        if not st.n_layers:
            return [gr.update() for _ in layer_names]
        return [gr.update(maximum=st.n_layers, value=min(int(vals[names.index(n)] or 1), st.n_layers))
                for n in layer_names]

    @plain_errors("encoding")
    @named("state", "model", "model_path", "use", "image", "video", "prompt", *names, extra=progress_param)
    def on_encode(st, model_name, path, kind, img, vid, text, *rest):
        vals, progress = rest[:n_ctl], rest[n_ctl]
        model_name = (path or "").strip() or model_name
        progress(0.1, desc=f"loading {model_name}" if model_name not in hub.loaded else "encoding (vision tower + prompt)")
        try:
            st, msg = logic.encode(st, model_name, kind, img, vid, text, text_mode=vals[names.index("text_mode")])
        except UserError as e:
            _error(e)
        progress(1.0, desc="encoded")
        unit, budget, heat = (vals[names.index(n)] for n in ("unit", "budget", "heat"))
        heat = int(heat) if heat is not None and -1 <= int(heat) < len(st.tokens) else -1
        return (st, msg, token_chips(st.tokens, heat), C.budget_slider(unit, st.n_visual, budget if unit == "%" else None),
                gr.update(value=heat), *layer_updates(st, vals))

    def view_fields(st, vals, frame=0):
        try:
            s = settings_of(st, vals)
            views, summary = logic.view(st, s)
            if frame and isinstance(st, UIState) and 0 < int(frame) <= st.n_frames:
                P.show_frame(views, logic.frame_box(st, int(frame) - 1))
            cached = logic.cached_answers(st, s)  # answers already made for these settings; never runs the LLM
        except UserError as e:
            _error(e)
        rest = (P.reference_md(cached["reference"]), s.to_string(), summary, token_chips(st.tokens, s.heat))
        return P.panel_fields(views, st.n_visual, cached, hint), rest

    @plain_errors("drawing the panels")
    @named("state", *names)
    def on_view(st, *vals):  # the /view API: every panel in full (visibility, labels, values)
        fields, rest = view_fields(st, vals)
        return (*P.panel_updates(fields), *rest)

    @plain_errors("drawing the panels")
    def on_live(st, shown, ask, raw, raw_open, auto, box, frame=0):
        """The page's view: only what changed since its last one. Answers and the raw-data JSON are
        events of their own, started by a change of `ask` (when answering automatically) and `raw`
        (while its accordion is open): a move that needs neither costs the page one event only.
        frame: a video's frame the panels show (0: all)."""
        fields, (reference, settings, summary, _) = view_fields(st, C.unbox(box), frame)  # plain_errors: a UserError's message
        updates, props = P.live_updates(fields, (shown or {}).get("props"))
        bump = lambda n, yes: int(n or 0) + 1 if yes else n  # noqa: E731
        return prepared(live_outs, [*updates, reference, settings, {"props": props, "summary": summary},
                                    bump(ask, auto), bump(raw, raw_open)])

    def generate_answers(st, vals, n_new, progress, bare=False):
        try:
            s = settings_of(st, vals)
            ans = logic.generate(st, s, int(n_new or logic.max_new_tokens), progress=progress)
        except UserError as e:
            _error(e)
        return (*P.answer_updates(list(s.methods), ans, hint, bare=bare), P.reference_md(ans["reference"]), ans)

    @plain_errors("answering")
    @named("state", *names, "max_new_tokens", extra=progress_param)
    def on_generate(st, *rest):
        return generate_answers(st, rest[:n_ctl], rest[n_ctl], rest[n_ctl + 1])

    @plain_errors("answering")
    @named("state", "shown", "controls", "max_new_tokens", extra=progress_param)
    def on_auto(st, shown, box, max_new, progress):
        """Answers after a view that asked for them (its panels are shown: bare values, no prop
        updates), and the view's raw data."""
        if not isinstance(st, UIState) or st.key is None:
            return (*[None] * MAX_PANELS, P.reference_md(None), None, None)
        return (*generate_answers(st, C.unbox(box), max_new, progress, bare=True), (shown or {}).get("summary"))

    @plain_errors("inspecting the patch")
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

    def on_click(st, frame, evt: gr.SelectData):
        """The clicked pixel, in the whole strip's coordinates (a single frame shown: offset by its place)."""
        x, y = evt.index
        if frame and isinstance(st, UIState) and 0 < int(frame) <= st.n_frames:
            try:
                x += logic.frame_box(st, int(frame) - 1)[0]
            except UserError as e:
                _error(e)
        return x, y

    def frame_range(st):
        n = st.n_frames if isinstance(st, UIState) else 0
        return gr.update(visible=n > 1, maximum=max(n, 1), value=0)

    def on_token(st, evt: gr.SelectData):
        idx = evt.index if isinstance(evt.index, int) else evt.index[0]
        return idx if isinstance(st, UIState) and 0 <= idx < len(st.tokens) else -1

    @plain_errors("exporting")
    @named("state", *names)
    def on_export(st, *vals):
        try:
            return logic.export(st, settings_of(st, vals), logic.new_export_dir())
        except UserError as e:
            _error(e)

    @plain_errors("reading the settings string")
    def on_apply(st, settings):
        try:
            s = Settings.parse(settings or "")
            check_methods(s.methods)  # what /view takes
        except (ValueError, UserError) as e:
            _error(plain(e))
        n_v = st.n_visual if isinstance(st, UIState) else 0
        vals = C.control_values(s, n_v)
        unit, budget = vals[1], vals[2]
        return (*vals[:2], C.budget_slider(unit, n_v, budget), *vals[3:])

    def on_chips(st, heat):
        return token_chips(st.tokens if isinstance(st, UIState) else [], int(-1 if heat is None else heat))

    def on_unit(st, unit):
        return C.budget_slider(unit, st.n_visual if isinstance(st, UIState) else 0)

    def boxed(fn, before: tuple = (), after: tuple = (), extra: tuple = ()):
        """The page's version of a handler: the controls arrive as one value, `ctl.box` (see
        `controls.BOX_JS`), between the inputs named `before` and `after`."""
        nb = len(before)

        @plain_errors("reading the controls")
        @named("state", *before, "controls", *after, extra=extra)
        def page(st, *args):
            return fn(st, *args[:nb], *C.unbox(args[nb]), *args[nb + 1:])

        return page

    view_outs = [*res.view_outputs(), res.reference, act.settings, res.view_json, res.tokens]
    # the page's view event writes only the panels (each output costs the page's script time)
    live_ins = [state, res.shown, res.ask, res.raw, res.raw_open, act.auto, ctl.box, res.frame]
    live_outs = [*res.view_outputs(), res.reference, act.settings, res.shown, res.ask, res.raw]
    gen_outs = [*res.answer_outputs(), res.reference, res.answers_json]
    auto_ins, auto_outs = [state, res.shown, ctl.box, act.max_new], [*gen_outs, res.view_json]
    enc_outs = [state, res.status, res.tokens, ctl.budget, ctl.heat, *layer_ctls]
    private = dict(api_visibility="private")
    # A slider move redraws the panels in its own event, outside the queue (no waiting behind answers
    # or other sessions' work: a view is prune + draw, milliseconds; the engine locks per session).
    # Answers follow in a queued event of their own (at most one pending per session: always_last),
    # started by the view's `ask` counter only when answering automatically. Progress goes on one
    # component: the page's script updates the status of every progress target at each step of
    # every event (tens of ms a move with all the panel fields as targets).
    views = dict(trigger_mode="always_last", show_progress="hidden", queue=False, show_progress_on=[act.settings],
                 **private)
    # on_live's outputs leave it post-processed (components.panel_files): no thread hop per output,
    # and an image the page already has is not encoded again
    live = dict(views, postprocess=False)
    answers = dict(trigger_mode="always_last", show_progress="hidden", concurrency_id="answers",
                   show_progress_on=[res.reference], **private)
    # the API's endpoints (one named input per control) on hidden buttons; the page's buttons run the
    # same handlers with the controls boxed, sharing each endpoint's concurrency limit
    api = {name: gr.Button(name, visible=False) for name in ("encode", "view", "generate", "inspect", "export")}
    encoding = dict(concurrency_id="encode", concurrency_limit=1)
    answering = dict(concurrency_id="generate", concurrency_limit=1)

    page_encode = boxed(on_encode, enc_names, extra=progress_param)
    enc_ins = [state, *inp.encode_inputs(), ctl.box]
    enc = inp.run.click(page_encode, enc_ins, enc_outs, show_progress_on=[res.status], **encoding, **private)
    sub = inp.prompt.submit(page_encode, enc_ins, enc_outs, show_progress_on=[res.status], **encoding, **private)
    api["encode"].click(on_encode, [state, *inp.encode_inputs(), *inputs], enc_outs, api_name="encode", **encoding)
    for ev in (enc, sub):  # a video gets the frame selector (an image hides it), then the panels
        ev.then(frame_range, state, res.frame, queue=False, show_progress="hidden", **private).then(
            on_live, live_ins, live_outs, **live)
    res.frame.change(on_live, live_ins, live_outs, **live)
    api["view"].click(on_view, [state, *inputs], view_outs, api_name="view")
    act.generate.click(boxed(on_generate, after=("max_new_tokens",), extra=progress_param), [state, ctl.box, act.max_new],
                       gen_outs, **answering, **private)
    api["generate"].click(on_generate, [state, *inputs, act.max_new], gen_outs, api_name="generate", **answering)
    for c in ctl.inputs():  # the page's own copy of the controls, rewritten in the page (no server call)
        c.change(None, ctl.inputs(), ctl.box, js=C.BOX_JS, queue=False, show_progress="hidden", **private)
    ctl.box.change(on_live, live_ins, live_outs, **live)
    # the answers' event starts once the panels' images have loaded (the wait runs in the page)
    res.ask.change(None, None, None, js=AFTER_IMAGES_JS, queue=False, **private).then(on_auto, auto_ins, auto_outs,
                                                                                   **answers)
    res.raw.change(lambda shown: (shown or {}).get("summary"), res.shown, res.view_json, **views)
    res.raw_box.expand(lambda shown: (True, (shown or {}).get("summary")), res.shown, [res.raw_open, res.view_json],
                       **views)
    res.raw_box.collapse(lambda: False, None, res.raw_open, **views)
    ctl.heat.change(on_chips, [state, ctl.heat], res.tokens, **views)
    # the user's unit switch resets the budget's range; Apply sets unit and budget together (no reset)
    ctl.unit.input(on_unit, [state, ctl.unit], [ctl.budget], show_progress_on=[act.settings], **private)
    res.tokens.select(on_token, [state], ctl.heat, show_progress_on=[act.settings], **private)
    if "lam" in ctl.params and "lam_rule" in ctl.params:  # the lam slider is disabled while lam_rule is auto
        params = parameters()
        ctl.params["lam_rule"].change(lambda rule: gr.update(**C.lam_props(params["lam"], rule)),
                                      ctl.params["lam_rule"], ctl.params["lam"], queue=False, show_progress="hidden",
                                      **private)
    page_inspect = boxed(on_inspect, after=("x", "y"))
    inspect_outs = [res.patch_tokens, res.patch_info]
    for p in res.panels:  # a clicked patch's PMI shows under the panel clicked (and in the Inspect section)
        p.mask.select(on_click, [state, res.frame], [res.px, res.py], **private).then(
            page_inspect, [state, ctl.box, res.px, res.py], inspect_outs, **private).then(
            P.patch_beside, [res.patch_tokens, res.px, res.py], p.patch, queue=False, show_progress="hidden",
            **private)
    res.inspect.click(page_inspect, [state, ctl.box, res.px, res.py], inspect_outs, **private)
    api["inspect"].click(on_inspect, [state, *inputs, res.px, res.py], inspect_outs, api_name="inspect")
    res.export.click(boxed(on_export), [state, ctl.box], res.files, **private)
    api["export"].click(on_export, [state, *inputs], res.files, api_name="export")
    act.apply.click(on_apply, [state, act.settings], ctl.inputs(), api_name="settings", show_progress_on=[act.settings])


__all__ = ["named", "token_chips", "wire"]
