"""The page's wiring: which widget's event runs which handler of `components.page.handlers`.

Gradio calls an event's function with positional values in the order of its inputs (state first);
each function here reads them into the handler's named values and lists its named outputs in the
order of the event's outputs. `named` gives the API's functions their parameter names. Gradio
injects gr.Progress positionally, as the last argument.
"""
from __future__ import annotations

import contextlib
import inspect

import gradio as gr

from mipruner.engine import parameters

from ..core.logic import AppLogic, UserError
from ..core.panel_files import prepared
from . import controls as C
from . import panels as P
from .guards import guard_inputs, plain_errors
from .handlers import ENCODE_FIELDS, Handlers, Media, controls_of
from .video import shown_for


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


@contextlib.contextmanager
def _shown():
    """A handler's UserError as the page's error (its message as it is)."""
    try:
        yield
    except UserError as e:
        _error(e)


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
    """Connect the widgets of one page (`inp`: Inputs, `res`: Results) to the handlers (`components.page.handlers`):
    each event's function below only reads its positional values into the handler's named ones."""
    H = Handlers(logic, auto_answers=auto_answers)
    # the API's controls: the page's, but for the budget a number box without bounds (the slider's range is
    # the last encoding's unit and size; `budget_of` checks the value against the unit sent with it)
    # the slider's default stays the API's default, so a call that leaves the budget out works as before
    api_budget = gr.Number(ctl.budget.value, visible=False, label="budget", elem_id="api-budget")
    inputs = [api_budget if c is ctl.budget else c for c in ctl.inputs()]
    names = C.control_names()
    n_ctl = len(names)
    progress_param = (inspect.Parameter("progress", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=gr.Progress()),)
    layer_ctls = [ctl.params[n] for n in H.layer_names]
    enc_names = ENCODE_FIELDS  # the API's names of encode_inputs()
    guard_inputs({**dict(zip(enc_names, inp.encode_inputs())),
                  **dict(zip(names, inputs)), "auto": act.auto, "max_new_tokens": act.max_new,
                  "settings": act.settings, "x": res.px, "y": res.py})

    @plain_errors("encoding")
    @named("state", *enc_names, *names, extra=progress_param)
    def on_encode(st, *rest):
        media, vals, progress = Media.of(*rest[:6]), controls_of(rest[6:6 + n_ctl]), rest[6 + n_ctl]
        with _shown():
            return H.encode(st, media, vals, progress).outputs()

    @plain_errors("drawing the panels")
    @named("state", *names)
    def on_view(st, *vals):  # the /view API: every panel in full (visibility, labels, values)
        with _shown():
            return H.view(st, controls_of(vals)).outputs()

    @plain_errors("drawing the panels")
    def on_live(st, shown, ask, raw, raw_open, auto, box, frame=0):
        """The page's view: only what changed since its last one. Answers and the raw-data JSON are
        events of their own, started by a change of `ask` (when answering automatically) and `raw`
        (while its accordion is open): a move that needs neither costs the page one event only.
        frame: a video's frame the panels show (0: all)."""
        vals = controls_of(C.unbox(box))  # plain_errors: a UserError's message
        with _shown():
            out = H.live(st, vals, shown=shown, ask=ask, raw=raw, raw_open=raw_open, auto=auto, frame=frame)
        return prepared(live_outs, out.outputs())

    @plain_errors("answering")
    @named("state", *names, "max_new_tokens", extra=progress_param)
    def on_generate(st, *rest):
        with _shown():
            return H.generate(st, controls_of(rest[:n_ctl]), rest[n_ctl], rest[n_ctl + 1]).outputs()

    @plain_errors("answering")
    @named("state", "shown", "controls", "max_new_tokens", extra=progress_param)
    def on_auto(st, shown, box, max_new, progress):
        """Answers after a view that asked for them (its panels are shown: bare values, no prop
        updates), and the view's raw data."""
        if not H.encoded(st):
            return (*H.no_answers().outputs(), None)
        vals = controls_of(C.unbox(box))
        with _shown():
            return (*H.generate(st, vals, max_new, progress, bare=True).outputs(), (shown or {}).get("summary"))

    @plain_errors("inspecting the patch")
    @named("state", *names, "x", "y")
    def on_inspect(st, *rest):
        with _shown():
            return H.inspect(st, controls_of(rest[:n_ctl]), *rest[n_ctl:]).outputs()

    def on_click(st, frame, evt: gr.SelectData):
        with _shown():
            return H.click(st, frame, *evt.index)

    def on_token(st, evt: gr.SelectData):
        return H.token(st, evt.index)

    @plain_errors("exporting")
    @named("state", *names)
    def on_export(st, *vals):
        with _shown():
            return H.export(st, controls_of(vals))

    @plain_errors("reading the settings string")
    def on_apply(st, settings):
        with _shown():
            vals = H.apply(st, settings)
        return tuple(vals[n] for n in names)

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
    # on_live's outputs leave it post-processed (components.core.panel_files): no thread hop per output,
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
    for ev in (enc, sub):  # a video gets the frame selector and its controls (an image hides them), then the panels
        ev.then(lambda st: (H.frame_range(st), shown_for(st)), state, [res.frame, ctl.video], queue=False,
                show_progress="hidden", **private).then(
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
    ctl.heat.change(H.chips, [state, ctl.heat], res.tokens, **views)
    # the user's unit switch resets the budget's range; Apply sets unit and budget together (no reset)
    ctl.unit.input(H.unit, [state, ctl.unit], [ctl.budget], show_progress_on=[act.settings], **private)
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


__all__ = ["named", "wire"]
