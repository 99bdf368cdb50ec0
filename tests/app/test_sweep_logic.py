"""The Sweep area's handlers without Gradio, on the embedded model: building a sweep from the page,
running, cancelling, the session cache, curves and downloads, the kept-mask strip; and the paper's
lambda rule answering the first example right at the app's default budget."""
from __future__ import annotations

import csv
import threading

import numpy as np
import pytest
from PIL import Image

from components.core import sweep_logic as SL
from components.core.examples import load_examples
from components.core.logic import AppLogic, UserError
from components.core.settings import Settings
from components.page.controls import DEFAULT_SHARE
from components.page.panels import method_notes
from mipruner.eval.metrics import query_recall, token_object_cover

EXAMPLE = load_examples()[0]
PAGE = Settings().params  # the page's controls at their defaults


@pytest.fixture(scope="module")
def logic(hub):
    return AppLogic(hub, max_new_tokens=4)


def test_first_example_is_answered_right_with_lambda_auto(logic):
    """"is there a purple square?" at the app's default budget (10%): lam auto = 1 (a yes/no
    question) keeps every purple patch and MI-Pruner answers yes, as the unpruned model does."""
    assert EXAMPLE["prompt"] == "is there a purple square?" and "purple square" in EXAMPLE["objects"]
    st, _ = logic.encode(None, "shapes-llava", "image", EXAMPLE["path"], None, EXAMPLE["prompt"])
    s = Settings(methods=("mi",), budget=DEFAULT_SHARE / 100)  # every other control at its default
    assert s.params["lam_rule"] == "auto"
    views, _ = logic.view(st, s)
    sel = views[0].selection
    assert sel.extras["lam"] == 1.0 and "auto: yes/no" in method_notes(sel)
    out = logic.generate(st, s, 4)
    assert out["methods"]["mi"]["text"].strip().lower().startswith("yes")
    assert out["reference"]["text"].strip().lower().startswith("yes")
    # the asked object's patches (purple pixels of the picture): all kept
    rgb = np.asarray(Image.open(EXAMPLE["path"]).convert("RGB")).astype(int)
    purple = np.abs(rgb - np.array([140, 40, 185])).max(-1) <= 30
    enc = logic.hub.get("shapes-llava")[0].encoded(st.session, st.key)
    cover = token_object_cover(enc.geometry, [purple])
    assert int((cover >= 0.2).sum()) >= 4 and query_recall(sel.keep, cover) == 1.0
    # a fixed lambda stays selectable, and the panel says so
    fixed, _ = logic.view(st, s.replace(lam_rule="fixed", lam=0.5))
    assert fixed[0].selection.extras["lam"] == 0.5 and "lam 0.5 (fixed)" in method_notes(fixed[0].selection)


def test_make_sweep_from_the_page():
    sw = SL.make_sweep(["mi", "random"], "budget", "4,8", 16, PAGE, "question", 4)
    assert sw.values == (4, 8) and sw.params == {}  # defaults are not fixed: lam auto, Random's 3 seeds
    lam = SL.make_sweep(["mi"], "lam", SL.default_values("lam"), 16, {**PAGE, "lam": 0.3, "tau": 0.2}, "nostop", 4)
    assert lam.values == (0.0, 0.25, 0.5, 0.75, 1.0) and lam.params == {"tau": 0.2, "lam_rule": "fixed"}
    assert lam.text_mode == "nostop"
    for p in ("aggregation", "normalization", "text_mode", "layer", "tau"):
        assert SL.make_sweep(["mi", "fastv"], p, SL.default_values(p), 16, PAGE, "question", 4).param == p
    with pytest.raises(UserError, match="at least one method"):
        SL.make_sweep([], "budget", "4", 16, PAGE, "question", 4)
    with pytest.raises(UserError, match="tau must be in"):
        SL.make_sweep(["mi"], "tau", "0,0.1", 16, PAGE, "question", 4)
    with pytest.raises(UserError, match="takes"):
        SL.make_sweep(["random"], "lam", "0.5", 16, PAGE, "question", 4)
    with pytest.raises(UserError, match=r"^Items must be in \[1, 500\]"):
        SL.question_set("pope", SL.MAX_ITEMS + 1, 1).__enter__()
    with pytest.raises(UserError, match="upload a zip"):
        SL.question_set(SL.SETS[-1], 5, 1).__enter__()


def test_run_cache_cancel_plot_and_downloads(logic, tmp_path):
    engine = logic.hub.get("shapes-llava")[0]
    state = SL.SweepState()
    sw = SL.make_sweep(["mi", "random", "similarity"], "budget", "4,16", 16, PAGE, "question", 4)
    with SL.question_set("pope", 4, 1234) as (items, name):
        pass
    events = list(SL.run(state, engine, sw, items, name, "s1"))
    assert [e[:3] for e in events[:-1]] == [("progress", i, 4) for i in (1, 2, 3, 4)]
    kind, result, cached = events[-1]
    assert kind == "done" and not cached and result.n_items == 4 and result.n_encodes == 4
    assert "done" in SL.status(result) and state.current() is result
    # the same sweep again: from this session's cache, no model call
    again = list(SL.run(state, engine, sw, items, name, "s1"))
    assert len(again) == 1 and again[0][1] is result and again[0][2] is True
    fig = SL.figure(result, "kept", ["acc", "query_recall"])
    assert [a.get_title() for a in fig.axes if a.get_visible()] == ["accuracy", "query recall"]
    paths = SL.downloads(result, str(tmp_path))
    assert [p.rsplit(".", 1)[1] for p in paths] == ["csv", "json", "png"]
    rows = list(csv.DictReader(open(paths[0])))
    assert {r["method"] for r in rows} == {"none", "mi", "random", "similarity"}
    table = SL.points_table(result)
    assert len(table) == 1 + 3 * 2 and table[1][0] == "MI-Pruner"
    # cancel from another thread (as the Cancel button does) after the first item
    gen = SL.run(state, engine, SL.make_sweep(["mi"], "budget", "2,3", 16, PAGE, "question", 4), items, name, "s2")
    assert next(gen) == ("progress", 1, 4)
    t = threading.Thread(target=SL.cancel, args=("s2",))
    t.start()
    t.join()
    kind, partial, cached = list(gen)[-1]
    assert partial.cancelled and partial.n_items == 1 and "cancelled" in SL.status(partial)
    assert not SL.cancel("s2")  # nothing runs any more


def test_mask_strip_for_the_image_on_screen(logic):
    st, _ = logic.encode(None, "shapes-llava", "image", EXAMPLE["path"], None, EXAMPLE["prompt"])
    sw = SL.make_sweep(["mi", "random"], "budget", "4,8,16", 16, PAGE, "question", 4)
    img, md = SL.mask_strip(logic, st, sw)
    assert img.height >= 2 * SL.THUMB and img.width > 3 * SL.THUMB
    lines = [ln for ln in md.splitlines() if ln.startswith("| MI-Pruner") or ln.startswith("| Random")]
    assert len(lines) == 2
    mi_iou = [float(x) for x in lines[0].strip("| ").split("|")[1:]]
    # MI at lam 1 is a top-K: each kept set contains the smaller one, IoU = K_small / K_large
    assert mi_iou == [pytest.approx(4 / 8, abs=0.005), pytest.approx(8 / 16, abs=0.005)]
    tm = SL.make_sweep(["mi"], "text_mode", "question,prompt", 16, PAGE, "question", 4)
    img2, md2 = SL.mask_strip(logic, st, tm)  # re-encodes the picture per text mode
    assert "question -> prompt" in md2
    assert logic.hub.get("shapes-llava")[0].encoded(st.session, st.key) is not None  # still on screen
    with pytest.raises(UserError, match="run the model"):
        SL.mask_strip(logic, None, sw)
