"""Every registered method, wherever it selects, through the one front door `mipruner.select` on a
tiny LLaVA encoding (in-LLM methods included), and a method registered at run time reaching
`prune`, `select`, the eval runner, the settings string and the app's controls with no other edit."""
from __future__ import annotations

import pytest
import torch

import mipruner
from mipruner.pruners import Param, Selection, get_pruner, list_pruners, register_pruner, unregister_pruner

from mipruner.pruners.selection import selection_failures
from mipruner.testing import select_failures, spec_failures

from .conftest import TEST_DEVICE
from mipruner.media import Video

from .models.tiny_llava import save_tiny, scene

ALL = mipruner.list_pruners()


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    ad = mipruner.load(save_tiny("llava", str(tmp_path_factory.mktemp("contract") / "llava")), device=TEST_DEVICE)
    enc = ad.encode(scene(square=(8, 8, 40, 40)), "What colour is the square?", need_attention=True)
    frames = [scene(square=(8 + 6 * i, 8, 40 + 6 * i, 40), seed=i) for i in range(4)]
    clip = ad.encode(Video(frames=frames, indices=[0, 1, 2, 3], fps=4.0, total_frames=4),
                     "What colour is the square?", need_attention=True)
    return ad, enc, clip


@pytest.fixture
def model(loaded, request):
    """(adapter, encoding): an image, or a 4-frame clip for a video method (`MethodSpec.video`, EVS)."""
    ad, enc, clip = loaded
    name = request.node.callspec.params.get("name") if hasattr(request.node, "callspec") else None
    return ad, clip if name is not None and get_pruner(name).video else enc


@pytest.mark.parametrize("name", [n for n in ALL if get_pruner(n).video])
def test_a_video_method_on_an_image_is_a_sentence(loaded, name):
    ad, enc, _ = loaded
    with pytest.raises(ValueError, match="1 frame"):
        mipruner.select(ad, enc, name, 5)


@pytest.mark.parametrize("name", [n for n in ALL if get_pruner(n).stage != "llm" and not get_pruner(n).video])
@pytest.mark.parametrize("split", ["even", "uniqueness"])
def test_per_frame_on_a_clip_is_each_frame_alone(loaded, name, split):
    """select(..., per_frame=split) on a clip = the method run on each frame's rows alone at its share, joined."""
    from mipruner.pruners.per_frame import frame_budgets
    from mipruner.pruners.video import frame_slots

    ad, _, clip = loaded
    k = clip.n_visual // 3
    sel = mipruner.select(ad, clip, name, k, per_frame=split, cache={}, **({"seed": 0} if name == "random" else {}))
    frames = frame_slots(clip.frame_index, clip.n_visual, clip.visual.device)
    budgets, _ = frame_budgets(clip.visual, frames, k, split)
    assert sel.extras["frame_budgets"].tolist() == budgets and sum(budgets) == k
    spec = get_pruner(name)
    want = []
    for t, kt in enumerate(budgets):
        if not kt:
            continue
        idx = frames.index[t]
        kw = {"text": clip.scoring_text} if spec.needs_text else {}
        for inp in spec.inputs:
            x = getattr(clip, inp) if inp != "cache" else None
            if inp in ("attention", "keys") and x is not None:  # the [CLS] row first, then the frame's rows
                rows = torch.cat([torch.zeros(1, dtype=torch.long, device=idx.device), idx + 1]) \
                    if x.shape[0] == clip.n_visual + 1 else idx
                x = x[rows][:, rows] if inp == "attention" else x[rows]
            elif inp == "cls" and x is not None:
                x = x[t:t + 1] if x.shape[0] == frames.count else x
            elif x is not None:
                x = x[idx]
            if inp != "cache":
                kw[inp] = x
        part = mipruner.prune(name, visual=clip.visual[idx], budget=kt, **kw)
        want += idx[part.keep].tolist()
    assert sel.keep.tolist() == sorted(want)
    assert sel.budget == k or (spec.adaptive and 1 <= sel.budget <= k)
    ans = mipruner.answer(ad, clip, sel, max_new_tokens=2)
    assert ans.visual_tokens == sel.budget


def test_every_stage_is_registered():
    assert {get_pruner(n).stage for n in ALL} == {"projector", "vision", "llm"}
    assert {"mi", "fastv", "dart"} <= set(ALL)
    for n in ALL:  # every parameter is declared with a default that validates and a description
        for p in get_pruner(n).params:
            assert p.validate(p.default) == p.default and p.doc


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("budget", [1, 5, 0.25])
def test_select_contract(model, name, budget):
    ad, enc = model
    n = enc.n_visual
    sel = mipruner.select(ad, enc, name, budget, cache={})
    k = budget if isinstance(budget, int) else round(budget * n)
    n_prefix = 0 if sel.prefix is None else sel.prefix.shape[0]  # rows with no position (VisionZip's [CLS])
    adaptive = mipruner.get_pruner(name).adaptive  # FastVID may keep fewer, the budget its cap
    assert selection_failures(sel, n=n, k=k, adaptive=adaptive) == []  # the checks `mipruner.testing` runs on a plug-in
    assert sel.method == name and (sel.budget == k or adaptive and 1 <= sel.budget <= k)
    assert sel.keep.shape == (sel.budget - n_prefix,)


@pytest.mark.parametrize("name", ALL)
def test_select_keep_all_and_determinism(model, name):
    ad, enc = model
    assert mipruner.select(ad, enc, name, enc.n_visual).keep.tolist() == list(range(enc.n_visual))
    a, b = mipruner.select(ad, enc, name, 6), mipruner.select(ad, enc, name, 6, cache={})
    assert torch.equal(a.keep, b.keep) and torch.equal(a.order, b.order)


@pytest.mark.parametrize("name", ALL)
def test_the_checker_for_authors_passes_on_select(model, name):
    """`mipruner.testing`'s select checks and spec checks (what `python -m mipruner.check_pruner` runs)."""
    ad, enc = model
    assert spec_failures(name) == [] and select_failures(name, ad, enc) == []


@pytest.mark.parametrize("name", ALL)
def test_select_errors(model, name):
    ad, enc = model
    with pytest.raises(ValueError, match="budget"):
        mipruner.select(ad, enc, name, enc.n_visual + 1)
    with pytest.raises(TypeError, match="bogus"):
        mipruner.select(ad, enc, name, 3, bogus=1)
    assert mipruner.select(ad, enc, name, 3, strict=False, bogus=1).budget == 3  # one settings dict for all
    for p in get_pruner(name).params:
        if p.kind != "choice" and p.low is not None:
            with pytest.raises(ValueError, match=p.name):
                mipruner.select(ad, enc, name, 3, **{p.name: p.low - 1})


def test_select_unknown_method_suggests(model):
    ad, enc = model
    with pytest.raises(ValueError, match="Did you mean 'fastv'"):
        mipruner.select(ad, enc, "fastvv", 3)


def test_in_llm_methods_need_the_adapter(model):
    _, enc = model
    for name in list_pruners("llm"):
        with pytest.raises(ValueError, match="adapter"):
            mipruner.select(None, enc, name, 3)
        with pytest.raises(ValueError, match="inside the LLM"):
            mipruner.prune(name, visual=enc.visual, text=enc.scoring_text, budget=3)


def test_answer_on_every_stage(model):
    ad, enc = model
    cache: dict = {}
    ref = mipruner.answer(ad, enc, None, max_new_tokens=3)
    assert ref.visual_tokens == enc.n_visual
    for name in ("mi", "attention", "fastv"):
        sel = mipruner.select(ad, enc, name, 5, cache=cache)
        ans = mipruner.answer(ad, enc, sel, max_new_tokens=3, cache=cache)
        assert ans.visual_tokens == 5 and 1 <= len(ans.token_ids) <= 3


# ----------------------------------------------------------------- a method registered at run time
@pytest.fixture
def plugin():
    calls = []

    @register_pruner("corner_test", label="Corner (test)", params=(
        Param.real("corner_bias", 0.25, 0.0, 1.0, "test-only parameter", code="cb"),))
    def corner(visual, text, budget, *, corner_bias: float = 0.25) -> Selection:
        """Keeps the last `budget` tokens (a test method)."""
        calls.append(corner_bias)
        n = visual.shape[0]
        order = torch.arange(n - 1, n - 1 - budget, -1, device=visual.device)
        return Selection.from_order(order, torch.linspace(0, 1, n, device=visual.device))

    try:
        yield calls
    finally:
        unregister_pruner("corner_test")


def test_runtime_registered_method_is_picked_up_everywhere(model, plugin):
    ad, enc = model
    n = enc.n_visual
    # the tensor front door and the encoding front door
    sel = mipruner.prune("corner_test", visual=enc.visual, budget=4, corner_bias=0.5)
    assert sel.keep.tolist() == list(range(n - 4, n)) and plugin == [0.5]
    with pytest.raises(ValueError, match="corner_bias"):
        mipruner.select(ad, enc, "corner_test", 4, corner_bias=2.0)
    assert mipruner.select(ad, enc, "corner_test", 3).keep.tolist() == list(range(n - 3, n))
    # the eval runner (and its CLI options)
    from mipruner.eval.cli_options import add_param_options, param_values
    from mipruner.eval.runner import evaluate
    from mipruner.eval.tasks import EvalItem

    item = EvalItem(id="0", media=scene(), question="Is there a square?", answer="yes", kind="yesno", split="test")
    rows = evaluate(ad, [item], ["none", "corner_test"], [4], {"corner_bias": 0.75}, "t", max_new_tokens=2)
    assert {r["method"] for r in rows} == {"none", "corner_test"} and plugin[-1] == 0.75
    import argparse

    p = argparse.ArgumentParser()
    add_param_options(p)
    assert param_values(p.parse_args(["--corner-bias", "0.125"])) == {"corner_bias": 0.125}
    # the app: method list, settings string and generated controls
    from components.core.logic import method_choices
    from components.core.settings import Settings
    from components.page.controls import control_names, param_widget

    assert ("Corner (test)", "corner_test") in method_choices()
    s = Settings(methods=("corner_test",), budget=4, corner_bias=0.5)
    assert "cb=0.5" in s.to_string() and Settings.parse(s.to_string()) == s
    assert "corner_bias" in control_names()
    w = param_widget(get_pruner("corner_test").param("corner_bias"))
    assert (w.minimum, w.maximum, w.value) == (0.0, 1.0, 0.25)
