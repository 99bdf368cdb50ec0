"""Every refusal reaches the screen, in a real browser (headless Chromium via Playwright): a budget of 0, over
100 %, above the token count or empty, no method, a 7th method each show one sentence naming the field in the
refusal line over the panels (a slider move's event runs outside the queue, where Gradio's page shows no
error toast), the panels keep their last view, and the line clears once a move is applied; Run with an empty
prompt says so on the screen; and on the example clip every panel follows the budget down to 1 token and just
above one frame (where the per-frame chart used to fail and freeze the panels)."""
from __future__ import annotations

import re


from components.core.examples import load_examples
from components.core.logic import MAX_PANELS
from mipruner.serve.service import method_specs

from .conftest import run_clip


IMAGE = next(e for e in load_examples() if e["kind"] == "image")
CLIP = next(e for e in load_examples() if e["kind"] == "video")
TITLE_0 = "document.querySelector('#panel-0-title')"


def _kept(page) -> str:
    return re.search(r"\d+ / \d+ tokens kept", page.locator("#panel-0-title").inner_text()).group(0)


def _budget(page, value: str) -> None:
    box = page.locator("#budget input[type=number]")
    box.fill(value)
    box.press("Enter")


def _refused(page, says: str) -> str:
    """The refusal line once it says `says` (a regular expression): visible, one sentence."""
    page.wait_for_function("(r) => new RegExp(r, 'i').test((document.querySelector('#notice') || {}).innerText || '')",
                           arg=says)
    notice = page.locator("#notice")
    assert notice.is_visible()
    text = notice.inner_text().strip()
    assert text.startswith("Not applied: ") and text.endswith("The panels still show the last settings that worked.")
    return text


def _tokens_unit(page, n_visual: int) -> None:
    """Switch the budget's unit to tokens and wait until the switch has landed (the slider's range is 1-N_V):
    a value typed before that would be replaced by the range's default when the switch's reply arrives."""
    page.locator("#budget-unit").get_by_text("tokens").click()
    page.wait_for_function(f"(document.querySelector('#budget input[type=range]') || {{}}).max === '{n_visual}'")


def _applied(page, kept: str) -> None:
    page.wait_for_function(f"new RegExp('^{kept}').test(({TITLE_0}.innerText.split('\\n').find((l) => /tokens kept/.test(l)) || ''))")
    page.wait_for_function("!((document.querySelector('#notice') || {}).innerText || '').trim()")


def test_an_empty_prompt_is_said_on_the_screen(page):
    page.set_input_files("#image input[type=file]", IMAGE["path"])
    page.fill("#prompt textarea", "   ")
    page.click("#run")
    page.get_by_text(re.compile("the prompt is empty")).first.wait_for(state="visible")


def test_every_refused_move_is_a_visible_sentence_and_the_panels_stay(page):
    page.fill("#prompt textarea", IMAGE["prompt"])
    page.click("#run")
    page.wait_for_function(f"{TITLE_0} && /tokens kept/.test({TITLE_0}.innerText)")
    _budget(page, "10")
    _applied(page, "20 / 196 tokens kept")
    for value, says in (("0", r"Budget in % must be in \(0, 100\], got 0"), ("150", r"budget .*got 150"),
                        ("", "budget")):
        _budget(page, value)
        _refused(page, says)
        assert _kept(page) == "20 / 196 tokens kept"  # the panels keep the last view that worked
        _budget(page, "10")
        _applied(page, "20 / 196 tokens kept")
    _tokens_unit(page, 196)
    _budget(page, "5")
    _applied(page, "5 / 196 tokens kept")
    _budget(page, "500")
    _refused(page, "budget in tokens must be at most 196")
    _budget(page, "7")
    _applied(page, "7 / 196 tokens kept")
    methods = page.locator("#methods")
    checked = [c for c in [s.label for s in method_specs()] if methods.get_by_label(c, exact=True).is_checked()]
    for label in checked:  # no method at all
        methods.get_by_label(label, exact=True).uncheck()
    _refused(page, "methods: choose at least one method")
    more = [s.label for s in method_specs()][:MAX_PANELS + 1]
    for label in more:  # a 7th method
        methods.get_by_label(label, exact=True).check()
    _refused(page, f"methods: choose at most {MAX_PANELS} at once, got {MAX_PANELS + 1}")
    methods.get_by_label(more[-1], exact=True).uncheck()
    _applied(page, "7 / 196 tokens kept")


def test_every_panel_of_the_clip_follows_the_budget_down_to_one_token(page):
    run_clip(page, CLIP)
    page.wait_for_function(f"{TITLE_0} && /\\/ 1568 tokens kept/.test({TITLE_0}.innerText)")
    _tokens_unit(page, 1568)
    methods = page.locator("#methods")
    if not methods.get_by_label("EVS (video)", exact=True).is_checked():
        methods.get_by_label("EVS (video)", exact=True).check()
    for k in ("1", "197", "2"):
        _budget(page, k)
        _applied(page, f"{k} / 1568 tokens kept")
        titles = page.evaluate("[...Array(6).keys()].map((i) => document.querySelector(`#panel-${i}-title`))"
                               ".filter((t) => t && t.offsetParent !== null).map((t) => t.innerText)")
        assert len(titles) >= 2 and any(t.startswith("EVS") for t in titles), titles
        assert all(re.search(r"\d+ / 1568 tokens kept", t) for t in titles), titles  # none failed, none froze
        assert page.get_by_text("Failed on this input").count() == 0
