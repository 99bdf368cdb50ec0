"""The controls column: methods, budget, MI's lambda / tau / aggregation / normalization, method
parameters, the settings string. `Controls.inputs()` is the fixed order every handler receives them
in, and `settings_from` turns those values into a validated `mipruner.engine.Settings`."""
from __future__ import annotations

from dataclasses import dataclass, fields

import gradio as gr

from mipruner.engine import Settings
from mipruner.models.text import TEXT_MODES
from mipruner.pruners.mi import AGGREGATIONS, NORMALIZATIONS

from .logic import DEFAULT_METHODS, UserError, budget_of, check_methods, method_choices

DEFAULT_SHARE = 10.0  # % of the visual tokens kept at start (LLaVA-1.5 in the paper: 64 of 576 = 11%)


@dataclass
class Controls:
    methods: gr.CheckboxGroup
    unit: gr.Radio
    budget: gr.Slider
    lam: gr.Slider
    tau: gr.Slider
    aggregation: gr.Radio
    normalization: gr.Radio
    text_mode: gr.Radio
    seed: gr.Number
    theta: gr.Slider
    dominant_ratio: gr.Slider
    ratio: gr.Slider
    split: gr.Slider
    layer: gr.Slider
    heat: gr.Number

    def inputs(self) -> list:
        return [getattr(self, f.name) for f in fields(self)]

    def live(self) -> list:
        """Controls whose change re-renders the panels (text_mode needs a new encoding instead)."""
        return [c for c in self.inputs() if c is not self.text_mode]


CONTROL_NAMES = [f.name for f in fields(Controls)]


def build_controls() -> Controls:
    d = Settings()
    methods = gr.CheckboxGroup(method_choices(), value=list(DEFAULT_METHODS), label="Methods (side by side, up to 6)",
                               elem_id="methods")
    with gr.Row():
        unit = gr.Radio(["%", "tokens"], value="%", label="Budget unit", scale=1, elem_id="budget-unit")
        budget = gr.Slider(1, 100, value=DEFAULT_SHARE, step=1, label="Budget (% of visual tokens)", scale=3,
                           elem_id="budget")
    lam = gr.Slider(0.0, 1.0, value=d.lam, step=0.05, label="lambda (1 = relevance only, lower = more diversity)",
                    elem_id="lam")
    tau = gr.Slider(0.01, 1.0, value=d.tau, step=0.01, label="tau (PMI temperature)", elem_id="tau")
    with gr.Row():
        aggregation = gr.Radio(list(AGGREGATIONS), value=d.aggregation, label="Aggregation over prompt tokens",
                               elem_id="aggregation")
        normalization = gr.Radio(list(NORMALIZATIONS), value=d.normalization, label="Normalization",
                                 elem_id="normalization")
    text_mode = gr.Radio(list(TEXT_MODES), value=d.text_mode, label="Prompt tokens that count as text "
                         "(question / question without stopwords / whole chat prompt); changing it re-encodes",
                         elem_id="text-mode")
    with gr.Accordion("Method parameters", open=False):
        seed = gr.Number(value=d.seed, precision=0, minimum=0, label="Random: seed", elem_id="seed")
        theta = gr.Slider(0.0, 1.0, value=d.theta, step=0.05, label="CDPruner: theta (relevance weight)")
        dominant_ratio = gr.Slider(0.0, 1.0, value=d.dominant_ratio, step=0.01,
                                   label="VisionZip: dominant share of the budget")
        ratio = gr.Slider(0.0, 1.0, value=d.ratio, step=0.05, label="VisPruner: important share of the budget")
        split = gr.Slider(0.0, 1.0, value=d.split, step=0.05, label="MI + attention: first-round share")
        layer = gr.Slider(1, 8, value=d.layer, step=1, label="FastV / DART: decoder layer K where they prune",
                          elem_id="layer")
        heat = gr.Number(value=d.heat, precision=0, minimum=-1, elem_id="heat-token",
                         label="Heatmap prompt token (index; -1 = each method's scores). Click a prompt word to set it.")
    return Controls(methods, unit, budget, lam, tau, aggregation, normalization, text_mode, seed, theta,
                    dominant_ratio, ratio, split, layer, heat)


def settings_from(methods, unit, budget, lam, tau, aggregation, normalization, text_mode, seed, theta,
                  dominant_ratio, ratio, split, layer, heat, n_visual: int = 0) -> Settings:
    """Settings from the control values (in `Controls.inputs()` order); UserError when invalid."""
    try:
        return Settings(methods=check_methods(methods), budget=budget_of(budget, unit, n_visual), lam=float(lam),
                        tau=float(tau), aggregation=aggregation, normalization=normalization, text_mode=text_mode,
                        seed=int(seed or 0), theta=float(theta), dominant_ratio=float(dominant_ratio),
                        ratio=float(ratio), split=float(split), layer=int(layer or 2),
                        heat=int(-1 if heat is None else heat))
    except (ValueError, TypeError) as e:
        raise UserError(str(e)) from None


def control_values(s: Settings, n_visual: int) -> list:
    """Control values that reproduce `s` (inverse of settings_from), in `Controls.inputs()` order."""
    if isinstance(s.budget, float):
        unit, budget = "%", round(100 * s.budget, 4)
    else:
        unit, budget = "tokens", s.budget
    return [list(s.methods), unit, budget, s.lam, s.tau, s.aggregation, s.normalization, s.text_mode, s.seed,
            s.theta, s.dominant_ratio, s.ratio, s.split, s.layer, s.heat]


def budget_slider(unit: str, n_visual: int, value=None):
    """The budget slider's range for a unit: 1-100 (%) or 1-N_V (tokens)."""
    if unit == "%":
        return gr.update(minimum=1, maximum=100, step=1, label="Budget (% of visual tokens)",
                         value=DEFAULT_SHARE if value is None else value)
    if not n_visual:  # nothing encoded yet: N_V unknown, keep the range; Run sets it from the encoding
        label = "Budget (tokens; the range follows the image after Run)"
        return gr.update(label=label) if value is None else gr.update(label=label, value=int(value))
    default = max(1, round(n_visual * DEFAULT_SHARE / 100))
    return gr.update(minimum=1, maximum=n_visual, step=1, label=f"Budget (tokens of {n_visual})",
                     value=default if value is None else min(int(value), n_visual))


__all__ = ["CONTROL_NAMES", "Controls", "build_controls", "budget_slider", "control_values", "settings_from"]
