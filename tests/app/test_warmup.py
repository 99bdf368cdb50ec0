"""The compiled path's warm-up at start-up (components/core/warmup.py) on the embedded model: it compiles the
shapes of the first views (backend: dynamo's CompileCounter, set in `common/decode.COMPILE`, which runs the
captured graphs eagerly), says so while it warms and then that it is ready, switches the model to the
compiled path only at the end, and a visitor's first views then compile nothing new and answer as the
plain path does (tie rule); a failure leaves the plain path with one sentence; the flag's choice."""
from __future__ import annotations

import pytest

from components.core.examples import load_examples
from components.core.logic import AppLogic
from components.core.settings import DEFAULT_METHODS, Settings
from components.hosting.hub import ModelHub
from components.page.controls import DEFAULT_SHARE
import mipruner
from components.core.warmup import COMPILED, WarmUp, compile_choice
from mipruner.models.common.path import PLAIN, DecodePath
from tests.models.batch_check import compare, one_by_one

EXAMPLE = next(e for e in load_examples() if e["kind"] == "image")
BUDGET = DEFAULT_SHARE / 100
NEW = 4


@pytest.fixture()
def hub():
    h = ModelHub("shapes-llava", device="cpu")  # its own model: the decode path is switched here
    h.load_default()
    return h


def encode(logic: AppLogic, state=None):
    return logic.encode(state, "shapes-llava", "image", EXAMPLE["path"], None, EXAMPLE["prompt"])


def test_the_flag_chooses_the_compiled_path():
    assert compile_choice("auto", "cuda", False) == (True, "")
    assert compile_choice("auto", "cpu", False) == (False, "")
    assert compile_choice("auto", "cuda", True) == (False, "")
    assert compile_choice("on", "cpu", False) == (True, "")
    on, why = compile_choice("on", "cuda", True)
    assert not on and "ZeroGPU" in why and why.count(".") == 1
    assert compile_choice("off", "cuda", False) == (False, "")
    with pytest.raises(ValueError, match="auto, on, off"):
        compile_choice("yes", "cuda", False)


def test_the_warm_up_compiles_the_first_views_shapes(hub, compile_counter):
    engine = hub.get(None)[0]
    a = engine.adapter
    seen: list[str] = []
    warm = WarmUp(engine, EXAMPLE["path"], EXAMPLE["prompt"], DEFAULT_METHODS, BUDGET, NEW, on_change=seen.append)
    logic = AppLogic(hub, max_new_tokens=NEW, warm=warm)
    state, status = encode(logic)
    assert "Warming up the compiled path" in status and "plain path" in status  # before the warm-up ends
    enc = engine.encoded(state.session, state.key)
    sels = [mipruner.select(a, enc, m, BUDGET, strict=False) for m in DEFAULT_METHODS]
    batches = [[None, *sels], sels, [None]]  # what the warm-up answers: the default view, a slider move, one
    refs = [one_by_one(a, enc, rows, NEW) for rows in batches]  # the plain path's answers
    assert a.decode_path == PLAIN and compile_counter.frame_count == 0

    assert warm.run()
    assert seen[0].startswith("Warming up the compiled path")
    n = len([m for m in seen if "answer shapes:" in m])
    assert n > len(batches) and seen[-2].startswith(f"Warming up the compiled path ({n} of {n}")
    assert seen[-1].startswith(f"The compiled path is warm ({n} answer shapes") and warm.message == seen[-1]
    assert a.decode_path == DecodePath(**COMPILED) and warm.note() == ""
    assert compile_counter.frame_count >= 2  # the fixed set's prefill and step shapes (and the tower's)
    compiled = compile_counter.frame_count

    # a visitor's first view (a new session), a slider move within the budget's bucket, one unpruned answer
    state, status = encode(logic)
    assert "Warming up" not in status
    settings = Settings(methods=DEFAULT_METHODS, budget=BUDGET)
    got = logic.generate(state, settings, NEW)
    view = [engine.cached_answer(state.session, state.key, m, BUDGET, settings.params, NEW)
            for m in (None, *DEFAULT_METHODS)]
    k = sels[0].keep.numel()
    move = k + 1 if k + 1 < enc.n_visual else k - 1  # a slider move
    logic.generate(state, Settings(methods=DEFAULT_METHODS, budget=move), NEW)
    fresh, _ = encode(logic)  # another visitor: the unpruned answer alone
    one = engine.generate(fresh.session, fresh.key, None, max_new_tokens=NEW)
    assert compile_counter.frame_count == compiled  # every shape was compiled by the warm-up
    assert got["reference"]["text"] == view[0].text and set(got["methods"]) == set(DEFAULT_METHODS)
    for ans, (ref, rec) in zip(view, refs[0]):
        assert compare(ans.token_ids, ref.token_ids, rec.margins) >= 1
    assert compare(one.token_ids, refs[2][0][0].token_ids, refs[2][0][1].margins) >= 1


def test_a_failed_warm_up_leaves_the_plain_path(hub, compile_counter):
    engine = hub.get(None)[0]
    seen: list[str] = []
    warm = WarmUp(engine, EXAMPLE["path"], EXAMPLE["prompt"], ("no-such-method",), BUDGET, NEW, on_change=seen.append)
    assert not warm.run()
    assert engine.adapter.decode_path == PLAIN and warm.state == "failed"
    assert seen[-1].startswith("The compiled path's warm-up failed (") and seen[-1].endswith(
        "so answers run on the plain path.")
    logic = AppLogic(hub, max_new_tokens=NEW, warm=warm)
    _, status = encode(logic)
    assert seen[-1] in status  # the encode status repeats why
    assert not WarmUp(engine, None, "", DEFAULT_METHODS, BUDGET, NEW).run()  # no example to warm up on


def test_the_app_starts_its_warm_up_and_shows_it(monkeypatch, compile_counter):
    """app.py with --compile on (CPU: the CompileCounter backend): the page has the warm-up's status line,
    the warm-up runs in the background and ends ready; --compile auto on a CPU, off, and on on a ZeroGPU
    Space build none."""
    import app
    import components.hosting.spaces_gpu as zero

    args = app.parse_args(["--model", "shapes-llava", "--device", "cpu", "--compile", "on", "--max-new-tokens", "4"])
    hub = ModelHub("shapes-llava", device="cpu")
    hub.load_default()
    monkeypatch.setattr(zero, "on_zero_gpu", lambda: True)  # (tests/app/test_zerogpu.py leaves a stand-in `spaces`)
    assert app.warm_up(args, hub) is None
    monkeypatch.setattr(zero, "on_zero_gpu", lambda: False)
    for mode in ("auto", "off"):
        assert app.warm_up(app.parse_args(["--model", "shapes-llava", "--compile", mode]), hub) is None
    warm = app.warm_up(args, hub)
    assert warm is not None and warm.state == "waiting"
    from components.page.ui import build_demo

    demo = build_demo(AppLogic(hub, max_new_tokens=4, warm=warm))
    assert any(getattr(b, "elem_id", None) == "warm-status" for b in demo.blocks.values())
    warm.start()
    assert warm.wait(600) and warm.state == "ready", warm.message
    assert hub.get(None)[0].adapter.decode_path == DecodePath(**COMPILED) and compile_counter.frame_count > 0


def test_the_page_says_warming_then_ready(hub, compile_counter):
    """In a browser: the status line under the model says the compiled path is warming while the warm-up
    waits for the model (the test holds the model's lock), then, without a reload, that it is warm; the
    API lists the same endpoints as without a warm-up."""
    from .conftest import chromium, launched, require_browser

    require_browser()  # skips (fails on CI) before anything starts
    from playwright.sync_api import expect

    engine = hub.get(None)[0]
    warm = WarmUp(engine, EXAMPLE["path"], EXAMPLE["prompt"], DEFAULT_METHODS, BUDGET, NEW)
    with launched(AppLogic(hub, max_new_tokens=NEW, warm=warm)) as url:
        from gradio_client import Client

        eps = Client(url, verbose=False).view_api(return_format="dict", print_info=False)
        assert set(eps["named_endpoints"]) == {"/encode", "/view", "/generate", "/inspect", "/export", "/settings",
                                               "/sweep", "/sweep_strip"}  # the status line's timer is private
        with chromium() as browser:
            page = browser.new_page()
            page.set_default_timeout(60_000)
            with engine.model_lock:  # the warm-up cannot encode until the page has shown it warming
                warm.start()
                page.goto(url)
                expect(page.locator("#warm-status")).to_contain_text("Warming up the compiled path")
            expect(page.locator("#warm-status")).to_contain_text("The compiled path is warm", timeout=300_000)
    assert warm.wait(60) and warm.state == "ready"
