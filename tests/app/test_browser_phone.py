"""The page on a phone (390 x 844) in a real browser (headless Chromium via Playwright): the controls'
sheet scrolls vertically only, every control in it can be reached and tapped (a hit-test at its centre
finds the control itself, not a panel's label or button drawn over it), and Run brings the results
into view.

Skips like tests/app/test_browser.py when chromium or playwright is missing (CI installs both)."""
from __future__ import annotations

import pytest

from components.core.examples import load_examples

from .conftest import chromium, launched, open_page
from .test_browser_page import run

IMAGE = next(e for e in load_examples() if e["kind"] == "image")
WIDTH, HEIGHT = 390, 844

# every control of the sheet: (selector of the control, selector of what a tap must land on inside it)
CONTROLS_JS = """() => {
  const sheet = document.querySelector('#controls-col');
  const out = [];
  for (const el of sheet.querySelectorAll('label, input, button, textarea')) {
    const r = el.getBoundingClientRect();
    if (r.width === 0 || r.height === 0 || el.closest('[id="controls-json"]')) continue;
    if (el.tagName === 'INPUT' && ['checkbox', 'radio'].includes(el.type)) continue;  // their labels are tapped
    out.push(el);
  }
  return out;
}"""

HIT_JS = """(els) => {
  const sheet = document.querySelector('#controls-col');
  const missed = [];
  for (const el of els) {
    el.scrollIntoView({block: 'nearest', inline: 'nearest'});
    const r = el.getBoundingClientRect();
    const x = r.left + Math.min(r.width / 2, 20), y = r.top + r.height / 2;
    const hit = document.elementFromPoint(x, y);
    const what = (el.id || el.tagName) + ' "' + (el.innerText || el.value || '').trim().slice(0, 30) + '"';
    if (x < 0 || x > innerWidth || y < 0 || y > innerHeight) missed.push(what + ' off screen at ' + [x, y]);
    else if (!hit || !(el === hit || el.contains(hit) || hit.contains(el) && sheet.contains(hit)))
      missed.push(what + ' covered by ' + (hit ? (hit.closest('[id]') || {}).id || hit.tagName : 'nothing'));
  }
  return missed;
}"""


# taps over the whole sheet, every 12 px, at each screenful of its scroll: each lands inside the sheet
OVER_JS = """() => {
  const sheet = document.querySelector('#controls-col');
  const bad = new Set();
  for (let s = 0; s <= sheet.scrollHeight; s += sheet.clientHeight) {
    sheet.scrollTop = s;
    const r = sheet.getBoundingClientRect();
    for (let y = r.top + 2; y < r.bottom - 1; y += 12)
      for (let x = r.left + 2; x < r.right - 1; x += 12) {
        const hit = document.elementFromPoint(x, y);
        if (hit && !sheet.contains(hit)) bad.add((hit.closest('[id]') || {}).id || hit.tagName);
      }
  }
  sheet.scrollTop = 0;
  return [...bad];
}"""


@pytest.fixture(scope="module")
def url(hub):
    from components.core.logic import AppLogic

    with launched(AppLogic(hub, max_new_tokens=4), auto_answers=False) as u:
        yield u


def test_phone_controls_are_reachable_and_nothing_draws_over_them(url):
    with chromium() as browser:
        page = open_page(browser, url, WIDTH, HEIGHT)
        try:
            run(page)
            page.wait_for_function("document.querySelector('#panel-0-mask img') !== null")
            # Run brought the results into view: the status line and the first panel's title above the sheet
            sheet_top = page.evaluate("document.querySelector('#controls-col').getBoundingClientRect().top")
            top = lambda sel: page.evaluate(f"document.querySelector('{sel}').getBoundingClientRect().top")  # noqa: E731
            assert 0 <= top("#status") < sheet_top
            assert 0 <= top("#panel-0-title") < sheet_top
            sheet = page.evaluate("(() => { const s = document.querySelector('#controls-col');"
                                  " return [s.scrollWidth, s.clientWidth, s.scrollHeight, s.clientHeight]; })()")
            assert sheet[0] <= sheet[1], f"the sheet scrolls sideways: {sheet[0]} px wide in {sheet[1]}"
            # the budget shows first, without scrolling the sheet
            b = page.locator("#budget").bounding_box()
            assert sheet_top <= b["y"] and b["y"] + b["height"] <= HEIGHT and b["x"] + b["width"] <= WIDTH
            # panels' labels and buttons under the sheet: the page scrolled so the first panel's images lie under it
            page.evaluate("window.scrollBy(0, document.querySelector('#panel-0-mask').getBoundingClientRect().top"
                          f" - {sheet_top} + 20)")
            page.locator("#controls-col").get_by_text("Method parameters").click()  # the folded ones too
            page.wait_for_timeout(300)
            over = page.evaluate(OVER_JS)
            assert not over, f"drawn over the controls: {over}"
            els = page.evaluate_handle(CONTROLS_JS)
            n = page.evaluate("(els) => els.length", els)
            labels = page.evaluate("(els) => els.map((e) => (e.innerText || '').trim())", els)
            assert n > 30 and "VisPruner" in labels and "Apply" in labels, labels
            missed = page.evaluate(HIT_JS, els)
            assert not missed, missed
            assert page.evaluate("document.documentElement.scrollWidth") <= WIDTH
        finally:
            page.close()
