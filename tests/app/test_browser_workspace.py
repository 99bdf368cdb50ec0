"""The page as one workspace, in a real browser (headless Chromium via Playwright), measured by geometry: at
1,400 x 900 and at 390 x 844 a slider and the panels it moves are on screen together wherever the panels are
scrolled; Gradio's labels and buttons never lie over a panel's picture; "use" alone decides what Run encodes and
shows that input; Run waits for an example still loading; Enter in the prompt runs it; the settings string
copies; a panel never shows another method's picture while its own loads; a video's EVS note says what the rate
and the budget did, at a default that keeps more than frame 1; a merging method's legend is capped.

Skips like tests/app/test_browser.py when chromium or playwright is missing (CI installs both)."""
from __future__ import annotations

import re

import pytest

from components.core.examples import load_examples
from components.page.panels import LEGEND_CHIPS

from .conftest import launched, open_page, run_clip

IMAGE = next(e for e in load_examples() if e["kind"] == "image")
CLIP = next(e for e in load_examples() if e["kind"] == "video")
SIZES = [(1400, 900), (390, 844)]
TITLE = "(document.querySelector('#panel-0-title') || {}).innerText || ''"

# rectangles of what Gradio draws over each shown panel picture (its label, its buttons) that meet the picture
OVERLAYS_JS = """() => {
  const meets = (a, b) => a.left < b.right - 0.5 && b.left < a.right - 0.5 && a.top < b.bottom - 0.5 && b.top < a.bottom - 0.5;
  const out = [];
  for (const block of document.querySelectorAll('[id^="panel-"]')) {
    const img = block.querySelector('img');
    if (!img || img.getBoundingClientRect().width === 0) continue;
    const r = img.getBoundingClientRect();
    for (const o of block.querySelectorAll('[data-testid="block-label"], .icon-button-wrapper button')) {
      const q = o.getBoundingClientRect();
      if (q.width > 0 && meets(q, r)) out.push(block.id + ': ' + (o.getAttribute('aria-label') || o.innerText.trim()));
    }
  }
  return out;
}"""


@pytest.fixture(scope="module")
def url(hub):
    from components.core.logic import AppLogic

    with launched(AppLogic(hub, max_new_tokens=4), auto_answers=False) as u:
        yield u


def run_image(page):
    page.set_input_files("#image input[type=file]", IMAGE["path"])
    page.fill("#prompt textarea", IMAGE["prompt"])
    page.click("#run")
    page.wait_for_function(f"/tokens kept/.test({TITLE})")


def rect(page, sel):
    return page.evaluate(f"(() => {{ const r = document.querySelector('{sel}').getBoundingClientRect();"
                         " return {top: r.top, bottom: r.bottom, left: r.left, right: r.right}; })()")


def on_screen(r, size) -> bool:
    return r["top"] >= 0 and r["bottom"] <= size[1] and r["left"] >= 0 and r["right"] <= size[0]


def in_view(r, size) -> bool:  # some of it on screen
    return r["bottom"] > 0 and r["top"] < size[1]


@pytest.mark.parametrize("size", SIZES)
def test_a_slider_and_its_panels_are_in_view_together(browser, url, size):
    page = open_page(browser, url, *size)
    try:
        run_image(page)
        page.evaluate("document.querySelector('#controls-col').scrollTop = 0")
        sheet = rect(page, "#controls-col")
        # the panels scrolled under the top of the screen, first to last row: the budget stays on screen
        for sel in ("#panel-0-mask", "#panel-0-heat", "#panel-2-heat"):
            page.evaluate(f"window.scrollTo(0, document.querySelector('{sel}').getBoundingClientRect().top"
                          " + window.scrollY - 40)")
            page.wait_for_timeout(100)
            b, p = rect(page, "#budget"), rect(page, sel)
            assert on_screen(b, size), (sel, b)
            assert in_view(p, size) and p["top"] < (sheet["top"] if size[0] < 769 else size[1]), (sel, p)
            if size[0] >= 769:  # beside the panels, not over them
                assert b["left"] >= rect(page, "#results-col")["right"], b
        # a slider move redraws the panel on screen
        before = page.evaluate(TITLE)
        box = page.locator("#budget input[type=number]")
        box.fill("30")
        box.press("Enter")
        page.wait_for_function(f"/\\b59 \\/ 196 tokens kept/.test({TITLE})")
        assert page.evaluate(TITLE) != before
        assert on_screen(rect(page, "#budget"), size)
        assert page.evaluate("document.documentElement.scrollWidth") <= size[0]
    finally:
        page.close()


@pytest.mark.parametrize("size", SIZES)
def test_no_label_or_button_lies_over_a_panel_picture(browser, url, size):
    page = open_page(browser, url, *size)
    try:
        run_image(page)
        page.wait_for_function("document.querySelector('#panel-0-mask img').complete")
        assert page.locator("[id^='panel-'] img").count() >= 6
        over = page.evaluate(OVERLAYS_JS)
        assert not over, over
    finally:
        page.close()


def test_use_decides_what_shows_and_what_run_encodes(browser, url):
    page = open_page(browser, url, *SIZES[0])
    try:
        assert page.locator("#media-tabs").count() == 0  # no second switch that could disagree
        page.locator("#examples").get_by_text(CLIP["prompt"]).click()
        page.wait_for_selector("#video video")
        assert page.locator("#use input:checked").get_attribute("value") == "video"
        assert page.locator("#video").is_visible() and not page.locator("#image").is_visible()
        page.locator("#use").get_by_text("image").click()  # the image (none yet) shows: Run says so
        page.wait_for_selector("#image", state="visible")
        assert not page.locator("#video").is_visible()
        page.set_input_files("#image input[type=file]", IMAGE["path"])
        page.click("#run")
        page.wait_for_function(f"/tokens kept/.test({TITLE})")
        status = page.locator("#status").inner_text()
        assert "1 image -> 196 visual tokens" in status and "frames" not in status, status
        page.locator("#use").get_by_text("video").click()  # the clip shows again: Run encodes the clip
        page.wait_for_selector("#video", state="visible")
        page.click("#run")
        page.wait_for_function("/8 frames/.test(document.querySelector('#status').innerText)")
    finally:
        page.close()


def test_run_waits_for_an_example_still_loading_and_enter_runs(browser, url):
    """The examples' load is held in the network (a slow server at start-up) while Run is pressed: the inputs
    show Gradio's progress, and Run encodes the example once it arrives, never "the prompt is empty"."""
    page = open_page(browser, url, *SIZES[0])
    held, joined, hold = [], [], [True]
    page.on("request", lambda r: joined.append(r.url) if "queue/join" in r.url else None)
    try:
        page.route("**/gradio_api/run/predict", lambda route: held.append(route) if hold[0] else route.continue_())
        example = next(e for e in load_examples() if e["kind"] == "image" and e["prompt"] != IMAGE["prompt"])
        page.locator("#examples").get_by_text(example["prompt"]).click()
        page.wait_for_function("(window.mipExample || 0) > 0")
        page.wait_for_selector("#prompt [data-testid='status-tracker']:not(.hide)")  # the load's progress shows
        page.click("#run")
        page.wait_for_timeout(500)  # Run pressed during the load: nothing encoded yet, no error
        assert not joined, "Run read the inputs before the example arrived"
        assert "empty" not in page.locator("#status").inner_text()
        hold[0] = False
        for route in held:
            route.continue_()
        page.wait_for_function(f"/tokens kept/.test({TITLE})")
        status = page.locator("#status").inner_text()
        assert "empty" not in status and "1 image -> 196 visual tokens" in status, status
        words = [w for w in re.findall(r"[a-z]+", example["prompt"]) if len(w) > 3]
        assert all(w in page.locator("#tokens").inner_text() for w in words), words  # the example's prompt

        # Enter in the prompt runs it (Shift+Enter would add a line)
        page.fill("#prompt textarea", "is there a red circle?")
        page.press("#prompt textarea", "Enter")
        page.wait_for_function("/red/.test(document.querySelector('#tokens').innerText)")
        assert page.input_value("#prompt textarea") == "is there a red circle?"
    finally:
        page.close()


def test_settings_copy_and_no_stale_picture(browser, url):
    page = open_page(browser, url, *SIZES[0], permissions=["clipboard-read", "clipboard-write"])
    try:
        run_image(page)
        copy = page.locator("#settings button[aria-label='Copy']")
        copy.click()
        assert page.evaluate("navigator.clipboard.readText()") == page.input_value("#settings textarea")

        # the panel pictures' files are held while the methods change: panel 0 gets the next method's title,
        # and its picture is hidden until its own file has loaded (never the previous method's picture)
        img = "document.querySelector('#panel-0-mask img')"
        shown = f"(() => {{ const i = {img}; return [i.src, i.hasAttribute('data-swapping'), i.complete," \
                " getComputedStyle(i).visibility]; })()"
        old0, old1 = page.evaluate(f"{img}.src"), page.evaluate("document.querySelector('#panel-1-mask img').src")
        held, hold = [], [True]
        page.route("**/gradio_api/file=**", lambda route: held.append(route) if hold[0] else route.continue_())
        try:
            first = page.evaluate(TITLE).splitlines()[0]
            page.locator("#methods").get_by_text("MI-Pruner", exact=True).click()  # panel 0: the next method's
            page.wait_for_function(f"({TITLE}).split('\\n')[0] !== {first!r} && {img}.src !== {old0!r}")
            src, swapping, complete, vis = page.evaluate(shown)
            # its own picture (the one panel 1 showed, in the browser's cache), or nothing until it loads
            assert (src == old1 and complete and vis == "visible") or (swapping and vis == "hidden"), (src, swapping)
            # a budget move: new files for every picture, held: the old budget's pictures are hidden meanwhile
            box = page.locator("#budget input[type=number]")
            box.fill("20")
            box.press("Enter")
            page.wait_for_function(f"/\\b39 \\/ 196 tokens kept/.test({TITLE})")
            page.wait_for_function(f"{img}.hasAttribute('data-swapping')")
            assert page.evaluate(shown)[3] == "hidden"
        finally:
            hold[0] = False
            for route in held:
                route.continue_()
        page.wait_for_function(f"!{img}.hasAttribute('data-swapping') && {img}.complete")
        assert page.evaluate(shown)[3] == "visible"
    finally:
        page.close()


def test_a_video_shows_evs_at_work_with_its_note_and_a_capped_legend(browser, url):
    page = open_page(browser, url, *SIZES[0])
    try:
        page.locator("#methods").get_by_text("EVS (video)").click()
        page.locator("#methods").get_by_text("Pool (downsampling)").click()
        run_clip(page, CLIP)
        # a video's default budget: 25%, two frames' worth (10% is under one frame of 8)
        page.wait_for_function("Number(document.querySelector('#budget input[type=number]').value) === 25")
        evs = "[...document.querySelectorAll('[id$=\"-title\"]')].map((e) => e.innerText).find((t) => /EVS/.test(t))"
        page.wait_for_function(f"/392 \\/ 1568 tokens kept/.test({evs} || '')")
        note = page.evaluate(evs)
        assert "rate 0: the budget alone" in note and "frame 1 whole (196), then the 196 tokens of frames 2-8" in note
        # every timeline: no label or button over its bars and legend
        page.wait_for_selector("#panel-0-timeline img")
        drawn = page.evaluate("""[...document.querySelectorAll('[id$="-timeline"]')].flatMap((t) =>
            [...t.querySelectorAll('[data-testid="block-label"], .icon-button-wrapper button')]
            .filter((e) => e.getBoundingClientRect().width > 0).map((e) => t.id))""")
        assert not drawn, drawn
        # pool's "merged into" legend: LEGEND_CHIPS chips and a count of the rest
        pool = page.locator("[id$='-legend']", has_text="more (the picture shows every colour)")
        pool.first.wait_for()
        assert pool.first.locator("span[style*='width:12px']").count() == LEGEND_CHIPS
    finally:
        page.close()
