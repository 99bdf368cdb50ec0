"""How the page's events are wired for a live slider: the controls reach the page's own events as
one boxed value (components.page.controls.BOX_JS / unbox), the API keeps one named input per control,
and the view event hands Gradio prepared outputs."""
from __future__ import annotations

import json
import math

import gradio as gr
import pytest

from components.core.logic import AppLogic, UserError
from components.page import controls as C
from components.page.ui import build_demo


@pytest.fixture(scope="module")
def demo(hub):
    return build_demo(AppLogic(hub, max_new_tokens=4), auto_answers=False)


def _controls(demo) -> tuple[list, gr.Textbox]:
    boxes = [b for b in demo.blocks.values() if getattr(b, "elem_id", None) == "controls-json"]
    assert len(boxes) == 1
    by_id = {getattr(b, "elem_id", None): b for b in demo.blocks.values()}
    ins = next(f for f in demo.fns.values() if f.api_name == "settings").outputs  # the page's controls, in order
    assert by_id["budget"] in ins and len(ins) == len(C.control_names())
    # the API takes the same controls, but the budget as a number without the slider's range (its unit says)
    api_view = next(f for f in demo.fns.values() if f.api_name == "view")
    assert list(api_view.inputs[1:]) == [by_id["api-budget"] if c is by_id["budget"] else c for c in ins]
    assert by_id["api-budget"].minimum is None and by_id["api-budget"].maximum is None
    return list(ins), boxes[0]


def test_the_box_starts_with_every_controls_default(demo):
    ins, box = _controls(demo)
    assert json.loads(box.value) == [c.value for c in ins]
    assert C.unbox(box.value) == [c.value for c in ins]


def test_page_events_take_the_box_and_the_api_takes_each_control(demo):
    ins, box = _controls(demo)
    controls = {c._id for c in ins} | {b._id for b in demo.blocks.values() if getattr(b, "elem_id", None) == "api-budget"}
    syncs = 0
    for f in demo.fns.values():
        takes = [b for b in f.inputs if b._id in controls]
        if f.fn is None and f.outputs == [box]:  # the page's scripts that write the controls into the box
            assert f.js == C.BOX_JS and f.inputs == ins
            syncs += 1
        elif f.fn is None:  # other scripts of the page (the wait for the panels' images) take nothing
            assert f.js and not f.inputs and not f.outputs
        elif f.api_name in ("encode", "view", "generate", "inspect", "export", "sweep", "sweep_strip"):
            assert f.api_visibility != "private"
        elif f.api_name == "settings":
            assert f.outputs == ins  # Apply sets every control (their changes then refresh the box)
        else:  # every private backend event: the box, or the one control it is about (unit, heat token)
            assert len(takes) <= 1, f"{f.name} takes {len(takes)} controls one by one"
    assert syncs == len(ins)
    live = [f for f in demo.fns.values() if f.name == "on_live"]
    assert live and all(box in f.inputs and f.postprocess is False for f in live)
    assert any(tuple(t) == (box._id, "change") for f in live for t in f.targets)  # a control's move starts it


def test_unbox_refuses_what_is_not_the_controls():
    n = len(C.control_names())
    good = json.dumps([None] * n)
    assert C.unbox(good) == [None] * n
    assert C.unbox(json.dumps([1.5] * n)) == [1.5] * n
    nan = C.unbox("[" + ", ".join(["NaN"] * n) + "]")  # Python's json reads NaN: unset, as the page's null
    assert nan == [None] * n
    for bad in (None, "", "{", json.dumps([0] * (n - 1)), json.dumps({"a": 1}), 3):
        with pytest.raises(UserError, match="reload the page"):
            C.unbox(bad)
    assert not any(isinstance(v, float) and math.isnan(v) for v in nan)
