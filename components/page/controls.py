"""The controls column, generated from the method registry's specs: methods, budget, the prompt
tokens scored, the heatmap token, and one widget per registered method parameter (a new method
with a parameter gets its control with no edit here).

`Controls.inputs()` is the fixed order every handler receives the values in (`Controls.names()`
names them), and `settings_from` turns those values into validated `Settings`.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass

import gradio as gr

from mipruner.serve.service import TEXT_MODES, method_specs, parameters

from ..core.logic import UserError, budget_of, check_methods, method_choices
from ..core.settings import DEFAULT_METHODS, Settings
from .video import build_video_controls

DEFAULT_SHARE = 10.0  # % of the visual tokens kept at start (LLaVA-1.5 in the paper: 64 of 576 = 11%)
# a video's: 10% of 8 frames is under one frame, where EVS keeps frame 1 alone; 25% leaves it a frame's worth of
# what changes over frames 2..T (and the per-frame split a share of each)
VIDEO_SHARE = 25.0


def default_share(frames: int = 0) -> float:
    """The budget's default % for an input of `frames` frames (0 or 1: an image)."""
    return VIDEO_SHARE if frames > 1 else DEFAULT_SHARE
FEATURED = ("lam", "lam_rule", "tau", "aggregation", "normalization")  # MI-Pruner's own: shown above, the rest folded
APP_FIELDS = ("methods", "unit", "budget", "text_mode", "heat")


@dataclass
class Controls:
    methods: gr.CheckboxGroup
    unit: gr.Radio
    budget: gr.Slider
    text_mode: gr.Radio
    heat: gr.Number
    params: dict  # parameter name -> its widget, in `parameters()` order
    # every control's value in one JSON list (`inputs()` order), kept current by the page itself
    # (BOX_JS): the page's events take this one input instead of one per control (`unbox`)
    box: gr.Textbox | None = None
    video: gr.Column | None = None  # the video-only parameters' group, shown for a video (`video.shown_for`)

    def inputs(self) -> list:
        return [self.methods, self.unit, self.budget, self.text_mode, self.heat, *self.params.values()]

    def live(self) -> list:
        """Controls whose change re-renders the panels (text_mode needs a new encoding instead)."""
        return [c for c in self.inputs() if c is not self.text_mode]


def control_names() -> list[str]:
    """The names of `Controls.inputs()`, in order (the API's parameter names)."""
    return [*APP_FIELDS, *parameters()]


def _label(p) -> str:
    users = [s.label for s in method_specs() if p.name in s.param_names]
    return f"{p.name} ({', '.join(users)})"


def param_widget(p, **extra):
    """One widget for a registered `Param`: a slider for a bounded number, a number box for an
    unbounded one, a radio for choices (shown as text). extra: more keyword arguments (interactive=...)."""
    kw = {"label": _label(p), "info": p.doc, "elem_id": f"param-{p.name}", **extra}
    if p.kind == "choice":
        return gr.Radio([str(c) for c in p.choices], value=str(p.default), **kw)
    if p.low is not None and p.high is not None and (p.kind == "float" or p.high - p.low <= 1000):
        lo = p.low + (p.step or 0.01) if p.low_open else p.low
        step = p.step or (1 if p.kind == "int" else (p.high - p.low) / 100)
        hi = p.high - (p.step or 0.01) if p.high_open else p.high
        return gr.Slider(lo, hi, value=p.default, step=step, precision=0 if p.kind == "int" else None, **kw)
    return gr.Number(value=p.default, precision=0 if p.kind == "int" else None,
                     minimum=p.low, maximum=p.high, **kw)


def build_controls() -> Controls:
    d = Settings()
    methods = gr.CheckboxGroup(method_choices(), value=list(DEFAULT_METHODS), label="Methods (side by side, up to 6)",
                               elem_id="methods")
    with gr.Row():
        unit = gr.Radio(["%", "tokens"], value="%", label="Budget unit", scale=1, elem_id="budget-unit")
        budget = gr.Slider(1, 100, value=DEFAULT_SHARE, step=1, label="Budget (% of visual tokens)", scale=3,
                           elem_id="budget")
    params = parameters()
    widgets = {n: param_widget(params[n], **lam_props(params[n], d.params.get("lam_rule"))) for n in FEATURED
               if n in params}
    text_mode = gr.Radio(list(TEXT_MODES), value=d.text_mode, label="Prompt tokens that count as text "
                         "(question / question without stopwords / whole chat prompt); changing it re-encodes",
                         elem_id="text-mode")
    video, video_widgets = build_video_controls(params, param_widget)
    widgets.update(video_widgets)
    with gr.Accordion("Method parameters", open=False):
        for name, p in params.items():
            if name not in widgets:
                widgets[name] = param_widget(p)
        heat = gr.Number(value=d.heat, precision=0, minimum=-1, elem_id="heat-token",
                         label="Heatmap prompt token (index; -1 = each method's scores). Click a prompt word to set it.")
    ctl = Controls(methods, unit, budget, text_mode, heat, {n: widgets[n] for n in params}, video=video)
    ctl.box = gr.Textbox(json.dumps([c.value for c in ctl.inputs()]), visible="hidden", elem_id="controls-json",
                         interactive=False)
    return ctl


def lam_props(p, rule) -> dict:
    """The lam slider's state under a lam rule: disabled (its value unused) under "auto", whose pick each
    MI panel's title names."""
    if p.name != "lam":
        return {}
    auto = str(rule) == "auto"
    return {"interactive": not auto,
            "info": p.doc + (" - disabled: lam_rule auto picks lam per prompt (the panel title says which); set "
                             "lam_rule to fixed to use this value" if auto else "")}


# Gradio's page keeps a loading status for every input of every event it has run and updates all of
# them at each step of every event (tens of ms a slider move with ~30 controls as inputs). So the
# page's own events read the controls from `Controls.box`, which this script (run in the page, no
# server call, so no loading status) rewrites from every control whenever one changes; the API's
# endpoints keep one named input each. It reads them all: when several controls change at once
# (Apply), scripts that each wrote one value into the box they read would overwrite each other.
BOX_JS = "(...values) => JSON.stringify(values)"


def unbox(box) -> list:
    """The control values in `Controls.box` (in `inputs()` order); UserError if it is not such a list."""
    try:
        vals = json.loads(box) if isinstance(box, str) else None
    except ValueError:
        vals = None
    if not isinstance(vals, list) or len(vals) != len(control_names()):
        raise UserError("the page's controls could not be read: reload the page")
    # JSON has no NaN: a non-finite number reaches the page's script as null (the field is unset)
    return [None if isinstance(v, float) and not math.isfinite(v) else v for v in vals]


@dataclass
class Actions:
    """Answering and reproducing: auto-answer, answer length, Generate, the settings string + Apply."""

    auto: gr.Checkbox
    max_new: gr.Number
    generate: gr.Button
    settings: gr.Textbox
    apply: gr.Button


def build_actions(max_new_tokens: int, auto_answers: bool) -> Actions:
    with gr.Row():
        auto = gr.Checkbox(value=auto_answers, elem_id="auto-answers",
                           label="Answer automatically after every change (cheap on the embedded "
                                 "model; on large models untick and press Generate)")
        max_new = gr.Number(value=max_new_tokens, precision=0, minimum=1, maximum=512, label="Max new tokens",
                            elem_id="max-new-tokens")
    generate = gr.Button("Generate answers", elem_id="generate")
    with gr.Row():
        settings = gr.Textbox(label="Settings string (copy to reproduce this view; paste + Apply)", elem_id="settings",
                              scale=4, buttons=["copy"])
        apply = gr.Button("Apply", scale=1, elem_id="apply")
    return Actions(auto, max_new, generate, settings, apply)


def _param_value(p, v):
    if p.kind == "choice":
        for c in p.choices:
            if str(c) == str(v):
                return c
        raise UserError(f"{p.name} must be one of {[str(c) for c in p.choices]}, got {v!r}")
    if v is None:
        raise UserError(f"set {p.name}")
    return int(v) if p.kind == "int" and float(v).is_integer() else v


def settings_from(*vals, n_visual: int = 0) -> Settings:
    """Settings from the control values (in `Controls.inputs()` order); UserError when invalid."""
    methods, unit, budget, text_mode, heat, *rest = vals
    params = parameters()
    if len(rest) != len(params):
        raise UserError(f"expected {len(params)} method parameters, got {len(rest)}")
    try:
        kw = {name: _param_value(p, v) for (name, p), v in zip(params.items(), rest)}
        return Settings(methods=check_methods(methods), budget=budget_of(budget, unit, n_visual), text_mode=text_mode,
                        heat=int(-1 if heat is None else heat), **kw)
    except (ValueError, TypeError) as e:
        raise UserError(str(e)) from None


def control_values(s: Settings, n_visual: int) -> list:
    """Control values that reproduce `s` (inverse of settings_from), in `Controls.inputs()` order."""
    if isinstance(s.budget, float):
        unit, budget = "%", round(100 * s.budget, 4)
    else:
        unit, budget = "tokens", s.budget
    params = parameters()
    vals = [str(v) if params[n].kind == "choice" else v for n, v in s.params.items()]
    return [list(s.methods), unit, budget, s.text_mode, s.heat, *vals]


def budget_slider(unit: str, n_visual: int, value=None, frames: int | None = None, prev_frames: int = 0):
    """The budget slider's range for a unit: 1-100 (%) or 1-N_V (tokens). frames: the new encoding's (given
    by Run); prev_frames: the last encoding's (0: none yet, the page starts at the image's default). When Run
    changes the medium (image <-> video), a % budget still at the last medium's default moves to the new one's
    (`default_share`); a share chosen by hand, or the same medium again, stays."""
    share = default_share(frames or 0)
    if unit == "%":
        changed = frames is not None and (frames > 1) != (prev_frames > 1)
        if changed and value is not None and float(value) == default_share(prev_frames):
            value = share
        return gr.update(minimum=1, maximum=100, step=1, label="Budget (% of visual tokens)",
                         value=share if value is None else value)
    if not n_visual:  # nothing encoded yet: N_V unknown, keep the range; Run sets it from the encoding
        label = "Budget (tokens; the range follows the image after Run)"
        return gr.update(label=label) if value is None else gr.update(label=label, value=int(value))
    default = max(1, round(n_visual * share / 100))
    return gr.update(minimum=1, maximum=n_visual, step=1, label=f"Budget (tokens of {n_visual})",
                     value=default if value is None else min(int(value), n_visual))


__all__ = ["APP_FIELDS", "BOX_JS", "Actions", "Controls", "unbox", "build_actions", "build_controls", "budget_slider", "control_names", "control_values",
           "default_share",
           "lam_props", "param_widget", "settings_from"]
