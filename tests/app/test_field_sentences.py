"""Errors as docs/app.md promises them: one sentence that names the field by its label on the page, never
raw Python. A sweep's bad values and bad number of items, a file from outside the upload cache, a budget
above the encoding's visual tokens, and the step limit, whose count and formula agree."""
from __future__ import annotations

import re

import pytest

from components.core import sweep_logic as SL
from components.core.logic import UserError
from components.core.settings import Settings
from components.core.sweep_queue import SweepLimits, steps_line, steps_of
from components.page.controls import control_names, control_values

from .test_bad_inputs import EXAMPLE, Raw, assert_plain

CTL = control_values(Settings(methods=("mi", "random"), budget=16), 196)
HOSTED = SweepLimits.for_server(True)
RAW_PYTHON = ("invalid literal", "could not convert", "base 10", "Traceback", "NoneType")


def labels(url: str) -> dict:
    """elem_id -> label of the running page's components."""
    import httpx

    return {c["props"].get("elem_id"): c["props"].get("label") for c in httpx.get(url + "config", timeout=30).json()
            ["components"] if c["props"].get("elem_id")}


def sweep_call(raw: Raw, values="4,8", n=2, qset="pope", budget=16):
    return raw.call("sweep", [["mi"], "budget", values, budget, qset, n, 1234, None, None, "value", ["acc"],
                              "shapes-llava", "", *CTL])


def test_a_sweeps_bad_values_and_items_are_named_by_their_labels(app_url):
    raw, page = Raw(app_url), labels(app_url)
    assert page["sweep-n"] == "Items" and page["sweep-values"].startswith("Values")
    for values in ("4,x,8", "4,,8.5.1", "abc"):
        ok, msg = sweep_call(raw, values=values)
        assert not ok and msg.startswith("Values: ") and "is not a number" in msg, msg
        assert not any(r in msg for r in RAW_PYTHON), msg
        assert_plain(msg)
    ok, msg = sweep_call(raw, values="4,4")
    assert not ok and msg.startswith("Values: duplicate values"), msg
    ok, msg = sweep_call(raw, n=SL.MAX_ITEMS + 1)
    assert not ok and msg.startswith(f"{page['sweep-n']} "), msg  # the label, not the API's n_items
    assert "n_items" not in msg


def test_a_budget_above_the_visual_tokens_is_refused_in_either_unit(app_url):
    raw = Raw(app_url)
    ok, out = raw.call("encode", ["shapes-llava", "", "image", {"path": EXAMPLE["path"]}, None, EXAMPLE["prompt"], *CTL])
    assert ok and "196 visual tokens" in out[1], out
    at = control_names().index
    for unit, value, want in (("tokens", 197, "budget in tokens must be at most 196"),
                              ("tokens", 10_000, "budget in tokens must be at most 196"),
                              ("%", 101, "budget in % must be in (0, 100]")):
        vals = list(CTL)
        vals[at("unit")], vals[at("budget")] = unit, value
        ok, msg = raw.call("view", vals)
        assert not ok and msg.startswith(want) and f"got {value:g}" in msg, (unit, value, msg)
    vals = list(CTL)
    vals[at("unit")], vals[at("budget")] = "tokens", 196
    ok, out = raw.call("view", vals)
    assert ok and [m["kept"] for m in out[-2]["methods"]] == [196, 196]


def test_a_file_from_outside_the_cache_is_named_whatever_its_tag(app_url):
    raw = Raw(app_url)
    for payload in ({"path": "/etc/passwd", "meta": {"_type": "gradio.FileData"}}, {"path": "/etc/passwd"}):
        ok, msg = raw.call("encode", ["shapes-llava", "", "image", payload, None, EXAMPLE["prompt"], *CTL])
        assert not ok and msg.startswith("image: ") and "could not be read" not in msg, msg


def test_the_step_limit_says_the_count_and_a_formula_that_gives_it():
    sw = SL.make_sweep(["mi", "random", "similarity"], "budget", "4,8,16,32,64", 16, {}, "question", 4)
    steps = steps_of(sw, 100)
    assert steps == 100 * (1 + 1 + 5 + 5 * 3 + 5)  # 1 encoding, 1 unpruned answer, Random's 3 seeds
    with pytest.raises(UserError) as e:
        list(SL.run(SL.SweepState(), type("E", (), {"model_name": "m"})(), sw, list(range(100)), "pope", "s",
                    limits=HOSTED))
    msg = str(e.value)
    assert f"needs {steps:,} model steps" in msg and steps_line(sw, 100) in msg, msg
    m = re.search(r"\(([\d,]+) items x \((\d+) encodings? \+ 1 unpruned answer \+ (\d+) pruned answers", msg)
    items, enc, pruned = (int(g.replace(",", "")) for g in m.groups())
    assert items * (enc + 1 + pruned) == steps  # the formula said gives the number said
    text_modes = SL.make_sweep(["mi"], "text_mode", "question,prompt", 16, {}, "question", 4)
    m = re.search(r"(\d+) items? x \((\d+) encodings? \+ 1 unpruned answer \+ (\d+) pruned answers?",
                  steps_line(text_modes, 3))
    assert int(m[1]) * (int(m[2]) + 1 + int(m[3])) == steps_of(text_modes, 3)
