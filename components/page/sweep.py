"""The Sweep area: one parameter over a question set, curves per method, downloads, and the strip of
kept-patch masks across the values for the image on screen. `build_sweep` makes the widgets (a
`SweepArea`) and wires them to `components.core.sweep_logic`; ui.py calls it once.

API endpoints: /sweep (area fields, model, page controls) -> state, status, plot, files, table;
/sweep_strip (area fields, page controls) -> strip image, IoU table. Cancel and re-plot are private.
The fixed method parameters and text mode are the page's controls; methods and parameters come
from the registry through the engine.
"""
from __future__ import annotations

import inspect
import logging
from dataclasses import dataclass

import gradio as gr

from mipruner.serve.service import method_specs

from ..core import sweep_logic as SL
from ..core.logic import UserError
from ..core.sweep_queue import Pace, SweepLimits, SweepQueue
from ..hosting.spaces_gpu import on_zero_gpu
from . import controls as C
from .calls import named

log = logging.getLogger("mipruner.app")

DEFAULT_METHODS = ("mi", "random", "similarity")
PLOT_LABELS = {"acc": "accuracy", "f1": "F1", "yes_rate": "yes-rate", "query_recall": "query recall",
               "kept": "tokens kept", "prune_ms": "select ms", "prefill_ms": "prefill ms"}
TABLE_HEADERS = ["method", "value", "acc", "f1", "yes_rate", "query_recall", "kept", "prune_ms", "prefill_ms", "n"]
FIELDS = ("sweep_methods", "sweep_param", "sweep_values", "sweep_budget", "question_set", "n_items", "set_seed", "zip",
          "questions")  # API names (the page controls keep theirs: methods, budget, ...)


@dataclass
class SweepArea:
    state: gr.State
    methods: gr.CheckboxGroup
    param: gr.Dropdown
    values: gr.Textbox
    budget: gr.Number
    qset: gr.Dropdown
    n: gr.Number
    seed: gr.Number
    zip: gr.File
    questions: gr.File
    x: gr.Radio
    metrics: gr.CheckboxGroup
    run: gr.Button
    cancel: gr.Button
    status: gr.Markdown
    plot: gr.Plot
    files: gr.File
    table: gr.Dataframe
    strip_run: gr.Button
    strip: gr.Image
    strip_info: gr.Markdown

    def fields(self) -> list:
        """What a sweep is made of, in FIELDS order."""
        return [self.methods, self.param, self.values, self.budget, self.qset, self.n, self.seed, self.zip,
                self.questions]


def _widgets() -> SweepArea:
    gr.Markdown("Vary **one** parameter over a question set and compare methods. Each item is encoded once; "
                "every method and value reuses the encoding. The other parameters and the text mode are the "
                "controls above. Headless: `python -m mipruner.eval sweep --help`.")
    with gr.Row():
        methods = gr.CheckboxGroup([(s.label, s.name) for s in method_specs()], value=list(DEFAULT_METHODS),
                                   label="Methods", elem_id="sweep-methods", scale=3)
        with gr.Column(scale=2):
            param = gr.Dropdown(SL.param_choices(), value="budget", label="Parameter to sweep", elem_id="sweep-param")
            values = gr.Textbox(SL.default_values("budget"), label="Values (comma-separated; budgets: tokens, or "
                                "shares in (0, 1])", elem_id="sweep-values")
            budget = gr.Number(16, precision=None, minimum=0, label="Budget when another parameter is swept "
                               "(tokens, or a share in (0, 1])", elem_id="sweep-budget")
    with gr.Row():
        qset = gr.Dropdown(list(SL.SETS), value="pope", label="Question set (generated for the embedded model, "
                           "or your own zip)", elem_id="sweep-set", scale=2)
        n = gr.Number(30, precision=0, minimum=1, maximum=SL.MAX_ITEMS, label="Items", elem_id="sweep-n", scale=1)
        seed = gr.Number(1234, precision=0, label="Scene seed (1234: held out from training)", elem_id="sweep-seed",
                         scale=1)
    with gr.Accordion("Your own set: a zip of images/videos + questions.jsonl (format in docs/sweeps.md)", open=False):
        with gr.Row():
            zip_file = gr.File(label="zip", file_types=[".zip"], type="filepath", elem_id="sweep-zip")
            questions = gr.File(label="questions.jsonl (when not inside the zip)", file_types=[".jsonl"],
                                type="filepath", elem_id="sweep-questions")
    with gr.Row():
        run = gr.Button("Run sweep", variant="primary", elem_id="sweep-run")
        cancel = gr.Button("Cancel", variant="stop", elem_id="sweep-cancel")
    status = gr.Markdown(elem_id="sweep-status")
    with gr.Row():
        x = gr.Radio([("swept value", "value"), ("mean tokens kept", "kept")], value="value", label="x axis",
                     elem_id="sweep-x")
        metrics = gr.CheckboxGroup([(v, k) for k, v in PLOT_LABELS.items()], value=list(PLOT_LABELS),
                                   label="Curves (empty ones are left out)", elem_id="sweep-metrics")
    plot = gr.Plot(label="curves", format="png", elem_id="sweep-plot")
    files = gr.File(file_count="multiple", label="CSV, JSON, PNG", elem_id="sweep-files")
    table = gr.Dataframe(headers=TABLE_HEADERS, label="points", elem_id="sweep-table", interactive=False)
    gr.Markdown("**The image on screen across the values**: kept patches per method, and the IoU between "
                "consecutive kept sets.")
    strip_run = gr.Button("Draw the kept-patch strip", elem_id="sweep-strip-run")
    strip = gr.Image(label="kept patches across the swept values", type="pil", format="png", interactive=False,
                     elem_id="sweep-strip")
    strip_info = gr.Markdown(elem_id="sweep-strip-info")
    return SweepArea(gr.State(None), methods, param, values, budget, qset, n, seed, zip_file, questions, x, metrics,
                     run, cancel, status, plot, files, table, strip_run, strip, strip_info)


ZERO_GPU = ("sweeps are not available on a ZeroGPU Space (they run the model for minutes, outside one GPU call): "
            "run the app locally or on a dedicated GPU, or use python -m mipruner.eval sweep")


def _error(e: Exception):
    raise gr.Error(str(e), print_exception=False)


def build_sweep(logic, page_state: gr.State, inp, ctl: C.Controls, limits: SweepLimits | None = None) -> SweepArea:
    """The Sweep area (call inside the page's Blocks): widgets, handlers and their wiring. limits: the server's
    bounds on a sweep (`SweepLimits.for_server`; default: a local server's)."""
    with gr.Accordion("Sweep: one parameter over a question set (ablation curves)", open=False,
                      elem_id="sweep"):
        area = _widgets()
    names = C.control_names()
    n_ctl = len(names)
    extra = (inspect.Parameter("request", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None, annotation=gr.Request),
             inspect.Parameter("progress", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=gr.Progress()))

    def make(fields, vals):
        """The sweep from the area's fields; the fixed parameters and text mode from the page's controls
        (whose own method choice does not matter here)."""
        methods, param, values, budget = fields[:4]
        if not isinstance(param, str):  # the API may send anything: the sweep's parsing reads text
            raise UserError(f"Parameter to sweep: choose one of its choices, got {str(param)[:40]!r}")
        if values is not None and not isinstance(values, str):
            raise UserError(f"{SL.VALUES}: give the values as text, comma-separated (such as 4,8,16), "
                            f"got {str(values)[:40]!r}")
        s = C.settings_from(list(vals[0] or ["mi"]), *vals[1:])
        return SL.make_sweep(methods, param, values, budget, s.params, s.text_mode, logic.max_new_tokens)

    limits = limits or SweepLimits.for_server(False)
    pace, queue = Pace(), SweepQueue(slots=1, max_waiting=limits.max_waiting)

    @named("sweep_state", *FIELDS, "x", "metrics", "model", "model_path", *names, extra=extra)
    def on_run(st, *rest):
        fields, (x, metrics, model, path), vals = rest[:9], rest[9:13], rest[13:13 + n_ctl]
        request, progress = rest[13 + n_ctl:]
        st = st if isinstance(st, SL.SweepState) else SL.SweepState()
        try:
            if on_zero_gpu():
                raise UserError(ZERO_GPU)
            sw = make(fields, vals)
            with SL.question_set(*fields[4:9], limits=limits, files=logic.files) as (items, set_name):
                engine, note = logic.hub.get((path or "").strip() or model)
                size = SL.estimate_line(pace, engine.model_name, sw, items)
                for ev in SL.run(st, engine, sw, items, set_name, request.session_hash if request else "",
                                 limits=limits, pace=pace, queue=queue):
                    if ev[0] == "waiting":
                        ahead = ev[1]
                        msg = f"Waiting for the sweep queue: {ahead} sweep{'s' * (ahead != 1)} before yours ({size})."
                        yield st, f"{note} {msg}".strip(), gr.update(), gr.update(), gr.update()
                    elif ev[0] == "progress":
                        done, total = ev[1], ev[2]
                        progress((done, total), desc=f"sweeping: {done} / {total} items")
                        yield (st, f"{note} Sweeping: {done} / {total} items ({size}) ...".strip(), gr.update(),
                               gr.update(), gr.update())
                    else:
                        result, cached = ev[1], ev[2]
                        yield (st, (note + " " + SL.status(result, cached)).strip(), SL.figure(result, x, metrics),
                               SL.downloads(result, logic.new_export_dir()),
                               SL.points_table(result))
        except UserError as e:
            _error(e)
        except Exception:  # noqa: BLE001 - the traceback goes to the server log; the caller gets a sentence
            log.exception("unexpected error while sweeping")
            _error("Something went wrong while sweeping. Try again, or try other values or another question set; "
                   "the server log has the details.")

    on_run.__annotations__ = {"request": gr.Request}  # Gradio finds gr.Request by annotation

    def on_cancel(request: gr.Request):
        running = SL.cancel(request.session_hash if request else "")
        return "Cancelling after the current selection ..." if running else gr.update()

    def on_replot(st, x, metrics):
        result = st.current() if isinstance(st, SL.SweepState) else None
        if result is None:
            return gr.update()
        try:
            return SL.figure(result, x, metrics)
        except UserError as e:
            _error(e)

    @named("state", *FIELDS, *names)
    def on_strip(ui, *rest):
        fields, vals = rest[:9], rest[9:9 + n_ctl]
        try:
            if on_zero_gpu():
                raise UserError(ZERO_GPU)
            sw = make(fields, vals)
            return SL.mask_strip(logic, ui, sw)
        except UserError as e:
            _error(e)

    # `input`, not `change`: only the visitor's own choice of parameter fills in its default values (a change
    # Gradio reports when the closed accordion's dropdown first mounts, late on a loaded server, wrote the
    # defaults over values the visitor had typed meanwhile)
    area.param.input(lambda p: SL.default_values(p), area.param, area.values, api_visibility="private")
    area.run.click(on_run, [area.state, *area.fields(), area.x, area.metrics, inp.model, inp.model_path,
                            *ctl.inputs()], [area.state, area.status, area.plot, area.files, area.table],
                   api_name="sweep", concurrency_id="sweep", concurrency_limit=limits.max_waiting + 1,
                   show_progress_on=[area.plot])  # SweepQueue runs one at a time; the others see their place
    area.cancel.click(on_cancel, None, area.status, queue=False, api_visibility="private")
    for c in (area.x, area.metrics):
        c.change(on_replot, [area.state, area.x, area.metrics], area.plot, api_visibility="private",
                 show_progress="hidden")
    area.strip_run.click(on_strip, [page_state, *area.fields(), *ctl.inputs()], [area.strip, area.strip_info],
                         api_name="sweep_strip")
    return area


__all__ = ["SweepArea", "build_sweep"]
