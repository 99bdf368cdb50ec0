"""The page's wiring: which widget's event runs which call of `components.page.calls` (what each event does
with its values by name), with which inputs and outputs, queued how.
"""
from __future__ import annotations

import functools

import gradio as gr

from ..core.kept import Kept
from ..core.logic import AppLogic
from ..core.panel_files import prepared
from . import controls as C
from . import panels as P
from .calls import Calls
from .calls import event as _event
from .guards import guard_inputs
from .handlers import ENCODE_FIELDS, Handlers
from .style import RUN_WAIT_JS
from .video import shown_for

MODEL_CALLS = 8  # encodes (and answers) Gradio lets through to the engine at once: the engine orders them

# Runs in the page before the answers' event: waits (at most 0.5 s) until the panels' images have
# loaded, so the server sends the new masks before it starts the LLM (which would slow their serving)
# and the page draws them before it handles a second event.
AFTER_IMAGES_JS = """async () => {
  const t0 = performance.now();
  const loading = () => Array.from(document.querySelectorAll('[id^="panel-"] img')).some((i) => !i.complete);
  while (loading() && performance.now() - t0 < 500) await new Promise((r) => requestAnimationFrame(r));
}"""


# Runs in the page when Run is pressed: the results area (its status line first, where the encode's
# progress shows; the panels under it) scrolled to the top of the screen. On a phone the results come
# after the inputs and the examples, a screen or two below Run.
SHOW_RESULTS_JS = """() => {
  const top = document.querySelector('#status');
  if (top) top.scrollIntoView({block: 'start'});
}"""


def wire(logic: AppLogic, state: gr.State, inp, ctl: C.Controls, act: C.Actions, res, *, auto_answers: bool,
         kept: Kept | None = None) -> None:
    """Connect the widgets of one page (`inp`: Inputs, `res`: Results) to the calls (`components.page.calls`).
    kept: the app's own record of encoded sessions, which every event reading `state` consults
    (`components.core.kept`)."""
    event = functools.partial(_event, kept=kept)
    H = Handlers(logic, auto_answers=auto_answers)
    # the API's controls: the page's, but for the budget a number box without bounds (the slider's range is
    # the last encoding's unit and size; `budget_of` checks the value against the unit sent with it)
    # the slider's default stays the API's default, so a call that leaves the budget out works as before
    api_budget = gr.Number(ctl.budget.value, visible=False, label="budget", elem_id="api-budget")
    inputs = [api_budget if c is ctl.budget else c for c in ctl.inputs()]
    names = C.control_names()
    layer_ctls = [ctl.params[n] for n in H.layer_names]
    lam_ctl = ctl.params.get("lam") if "lam_rule" in ctl.params else None
    guard_inputs({**dict(zip(ENCODE_FIELDS, inp.encode_inputs())),
                  **dict(zip(names, inputs)), "auto": act.auto, "max_new_tokens": act.max_new,
                  "settings": act.settings, "x": res.px, "y": res.py})
    calls = Calls(H, lam=lam_ctl is not None)

    view_outs = [*res.view_outputs(), res.reference, act.settings, res.view_json, res.tokens]
    # the page's view event writes only the panels (each output costs the page's script time)
    live_ins = [state, res.shown, res.ask, res.raw, res.raw_open, act.auto, ctl.box, res.frame]
    live_outs = [*res.view_outputs(), res.reference, act.settings, res.shown, res.ask, res.raw, res.notice]
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
    drawn = dict(views, postprocess=False)
    answers = dict(trigger_mode="always_last", show_progress="hidden", concurrency_id="answers",
                   show_progress_on=[res.reference], **private)
    # the API's endpoints (one named input per control) on hidden buttons; the page's buttons run the
    # same handlers with the controls boxed, sharing each endpoint's concurrency limit
    api = {name: gr.Button(name, visible=False) for name in ("encode", "view", "generate", "inspect", "export")}
    # several at once reach the engine, whose model slot sessions take in turns (mipruner/serve/turns.py) and which
    # refuses a session's third waiting request at once: Gradio's own queue would serve one flooder's 40 first
    encoding = dict(concurrency_id="encode", concurrency_limit=MODEL_CALLS)
    answering = dict(concurrency_id="generate", concurrency_limit=MODEL_CALLS)

    page_encode = event(calls.page_encode, "encoding", "state", *ENCODE_FIELDS, "controls", "fewer_views",
                        progress=True, capped=True)
    enc_ins = [state, *inp.encode_inputs(), ctl.box, inp.fewer]
    page_enc_outs = [*enc_outs, *([lam_ctl] if lam_ctl is not None else []), *[p.patch for p in res.panels], res.px,
                     res.py, res.patch_tokens, res.patch_info]
    # Run and Enter read the inputs once an example being loaded has arrived (RUN_WAIT_JS waits in the page)
    wait = dict(js=RUN_WAIT_JS, queue=False, show_progress="hidden", **private)
    enc = inp.run.click(None, None, None, **wait).then(page_encode, enc_ins, page_enc_outs,
                                                       show_progress_on=[res.status], **encoding, **private)
    sub = inp.prompt.submit(None, None, None, **wait).then(page_encode, enc_ins, page_enc_outs,
                                                           show_progress_on=[res.status], **encoding, **private)
    for trigger in (inp.run.click, inp.prompt.submit):
        trigger(None, None, None, js=SHOW_RESULTS_JS, queue=False, show_progress="hidden", **private)
    on_encode = event(calls.encode, "encoding", "state", *ENCODE_FIELDS, *names, progress=True, capped=True)
    api["encode"].click(on_encode, [state, *inp.encode_inputs(), *inputs], enc_outs, api_name="encode", **encoding)
    def live(v: dict) -> list:  # its outputs leave it in their wire form (postprocess=False)
        return prepared(live_outs, calls.live(v))

    on_live = event(live, "drawing the panels", "state", "shown", "ask", "raw", "raw_open", "auto", "controls", "frame")
    for ev in (enc, sub):  # a video gets the frame selector and its controls (an image hides them), then the panels
        ev.then(lambda st: (H.frame_range(st), shown_for(st)), state, [res.frame, ctl.video], queue=False,
                show_progress="hidden", **private).then(on_live, live_ins, live_outs, **drawn)
    res.frame.change(on_live, live_ins, live_outs, **drawn)
    api["view"].click(event(calls.view, "drawing the panels", "state", *names), [state, *inputs], view_outs,
                      api_name="view")
    act.generate.click(event(calls.stream, "answering", "state", "controls", "max_new_tokens"),
                       [state, ctl.box, act.max_new], gen_outs, show_progress_on=[res.reference],
                       **answering, **private)
    api["generate"].click(event(calls.generate, "answering", "state", *names, "max_new_tokens", progress=True,
                                capped=True),
                          [state, *inputs, act.max_new], gen_outs, api_name="generate", **answering)
    for c in ctl.inputs():  # the page's own copy of the controls, rewritten in the page (no server call)
        c.change(None, ctl.inputs(), ctl.box, js=C.BOX_JS, queue=False, show_progress="hidden", **private)
    ctl.box.change(on_live, live_ins, live_outs, **drawn)
    # the answers' event starts once the panels' images have loaded (the wait runs in the page)
    res.ask.change(None, None, None, js=AFTER_IMAGES_JS, queue=False, **private).then(
        event(calls.auto, "answering", "state", "shown", "controls", "max_new_tokens"), auto_ins, auto_outs, **answers)
    res.raw.change(lambda shown: (shown or {}).get("summary"), res.shown, res.view_json, **views)
    res.raw_box.expand(lambda shown: (True, (shown or {}).get("summary")), res.shown, [res.raw_open, res.view_json],
                       **views)
    res.raw_box.collapse(lambda: False, None, res.raw_open, **views)
    ctl.heat.change(H.chips, [state, ctl.heat], res.tokens, **views)
    # the user's unit switch resets the budget's range; Apply sets unit and budget together (no reset)
    ctl.unit.input(H.unit, [state, ctl.unit], [ctl.budget], show_progress_on=[act.settings], **private)
    res.tokens.select(calls.token, [state], ctl.heat, show_progress_on=[act.settings], **private)
    if lam_ctl is not None:  # the lam slider is disabled while lam_rule is auto, showing the value auto applies
        ctl.params["lam_rule"].change(H.lam_rule, [state, ctl.params["lam_rule"]], lam_ctl, queue=False,
                                      show_progress="hidden", **private)
    page_inspect = event(calls.inspect, "inspecting the patch", "state", "controls", "x", "y")
    inspect_outs = [res.patch_tokens, res.patch_info]
    for p in res.panels:  # a clicked patch's PMI shows under the panel clicked (and in the Inspect section)
        p.mask.select(calls.click, [state, res.frame], [res.px, res.py], **private).then(
            page_inspect, [state, ctl.box, res.px, res.py], inspect_outs, **private).then(
            P.patch_beside, [res.patch_tokens, res.px, res.py], p.patch, queue=False, show_progress="hidden",
            **private)
    res.inspect.click(page_inspect, [state, ctl.box, res.px, res.py], inspect_outs, **private)
    api["inspect"].click(event(calls.inspect, "inspecting the patch", "state", *names, "x", "y"),
                         [state, *inputs, res.px, res.py], inspect_outs, api_name="inspect")
    res.export.click(event(calls.export, "exporting", "state", "controls"), [state, ctl.box], res.files, **private)
    api["export"].click(event(calls.export, "exporting", "state", *names), [state, *inputs], res.files,
                        api_name="export")
    act.apply.click(event(calls.apply, "reading the settings string", "state", "settings"), [state, act.settings],
                    ctl.inputs(), api_name="settings", show_progress_on=[act.settings])


__all__ = ["AFTER_IMAGES_JS", "SHOW_RESULTS_JS", "wire"]
