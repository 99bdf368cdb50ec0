"""A video on the page in a real browser (headless Chromium via Playwright), at 1,400 px and at 390 px: every
frame of the panels' grid is drawn at least 160 px wide at 1,400 px and every patch at least 8 px at both
(measured: 166.2 px a frame, 11.9 px a patch at 1,400 beside the controls' column; 160.6 and 11.5 at 390), a
timeline of tokens kept per frame sits under every panel, a picked frame fills its panel, and a click on a known
patch of frame k, in the grid or on the picked frame, inspects frame k's patch.

Skips like tests/app/test_browser.py when chromium or playwright is missing (CI installs both)."""
from __future__ import annotations

import io
import re

import pytest

from components.core.examples import load_examples
from components.page import video as V

from .conftest import launched, open_page, run_clip
from .test_browser import colour_bar_columns

CLIP = next(e for e in load_examples() if e["kind"] == "video")
MIN_FRAME_PX, MIN_PATCH_PX = 160, 8


@pytest.fixture(scope="module")
def url(hub):
    from components.core.logic import AppLogic

    with launched(AppLogic(hub, max_new_tokens=2), auto_answers=False) as u:
        yield u


@pytest.fixture(scope="module")
def layout(hub):
    """The clip's grid as the app draws it (the same engine, a session of the test's own)."""
    engine, _ = hub.get("shapes-llava")
    session = engine.new_session()
    key = engine.encode(session, CLIP["path"], CLIP["prompt"])
    return engine.encoded(session, key), engine.layout(session, key)


def shown(page, sel: str) -> dict:
    """An image's box on the page (y from the page's top) and its own size, once it has loaded (scrolled to: the page loads them lazily)."""
    page.wait_for_selector(sel, state="attached")
    page.evaluate("(s) => document.querySelector(s).scrollIntoView({block: 'start'})", sel)
    page.wait_for_function("(s) => { const i = document.querySelector(s); return i && i.complete && i.naturalWidth > 0"
                           " && i.getBoundingClientRect().width > 0; }", arg=sel)
    return page.evaluate("(s) => { const i = document.querySelector(s), r = i.getBoundingClientRect();"
                         " return {x: r.x, y: r.y + window.scrollY, width: r.width, height: r.height, natural: i.naturalWidth,"
                         " naturalHeight: i.naturalHeight}; }", sel)


def inspected(page) -> dict | None:
    """The patch the page inspected last (the Inspect section's JSON), or None before any."""
    text = page.evaluate("() => (document.querySelector('#patch-info') || {}).innerText || ''")
    got = {name: re.search(rf'"?{name}"?\s*:\s*(\d+)', text) for name in ("token", "frame", "row", "col")}
    return None if not all(got.values()) else {k: int(m.group(1)) for k, m in got.items()}


def click_token(page, sel: str, pic: dict, x: float, y: float, before: dict | None) -> dict:
    """Click the picture at its own pixel (x, y), scrolled to near the top of the screen first (on a phone the
    controls' sheet covers the bottom third); the patch inspected once it differs from `before`."""
    scale = pic["width"] / pic["natural"]
    page.evaluate("([s, y]) => window.scrollBy(0, document.querySelector(s).getBoundingClientRect().top + y - 120)",
                  [sel, y * scale])
    box = page.evaluate("(s) => { const r = document.querySelector(s).getBoundingClientRect(); return [r.x, r.y]; }", sel)
    page.mouse.click(box[0] + x * scale, box[1] + y * scale)
    for _ in range(600):
        got = inspected(page)
        if got is not None and got != before:
            return got
        page.wait_for_timeout(100)
    raise AssertionError(f"the click at ({x}, {y}) inspected nothing new (still {before})")


@pytest.mark.parametrize("width", [1400, 390])
def test_a_video_on_the_page_can_be_read_and_clicked(browser, url, layout, width, tmp_path):
    enc, lay = layout
    page = open_page(browser, url, width, 900 if width > 400 else 844, timeout=90_000)
    try:
        assert not page.locator("#video-controls").is_visible()  # nothing encoded: no video controls
        run_clip(page, CLIP)
        page.wait_for_function(f"/ {enc.n_visual} tokens kept/.test((document.querySelector('#panel-0-title') || {{}})"
                               ".innerText || '')")
        page.wait_for_selector("#video-controls", state="visible")  # EVS's rate, the per-frame split
        assert page.locator("#video-controls #param-video_pruning_rate").count() == 1
        assert page.locator("#video-controls #param-per_frame").count() == 1
        grid_w = lay.size[0]
        panels = [i for i in range(6) if page.locator(f"#panel-{i}-title").is_visible()]
        assert len(panels) >= 2
        cols = max(r for r, _ in enc.geometry.grids)  # patches across a frame
        for i in panels:
            page.locator(f"#panel-{i}-mask").scroll_into_view_if_needed()
            pic = shown(page, f"#panel-{i}-mask img")
            assert pic["natural"] == grid_w  # the grid, not a strip
            frame_px = pic["width"] * lay.frame_wh[0][0] / pic["natural"]
            assert frame_px / cols >= MIN_PATCH_PX, (i, frame_px)  # every patch readable, at either width
            assert frame_px >= MIN_FRAME_PX or width < 400, (i, frame_px)  # a phone: the picker enlarges one
            tl = shown(page, f"#panel-{i}-timeline img")  # under the panel's picture, as wide as it allows
            assert tl["y"] > pic["y"] + pic["height"] - 1 and tl["width"] > 0.5 * min(pic["width"], tl["natural"])
        page.screenshot(path=str(tmp_path / f"video-{width}.png"), full_page=True)
        assert page.evaluate("document.documentElement.scrollWidth") <= width

        # a click on a known patch of frame k: frame k's patch is inspected (the grid, then k picked alone)
        header = page.get_by_text("Inspect a patch (click one in any kept-patch image)")
        header.evaluate("(e) => e.click()")  # its JSON: what was inspected (a phone's controls sheet may cover it)
        page.wait_for_selector("#patch-info", state="attached")
        token = 5 * 196 + 3 * 14 + 7  # frame 5 (the sixth), row 3, col 7
        f = int(enc.geometry.frame[token])
        want = {"token": token, "frame": f, "row": int(enc.geometry.row[token]), "col": int(enc.geometry.col[token])}
        x0, y0, x1, y1 = (int(v) for v in lay.rects[token])  # the patch in the grid's pixels
        sel = "#panel-0-mask img"
        page.locator("#panel-0-mask").scroll_into_view_if_needed()
        got = click_token(page, sel, shown(page, sel), (x0 + x1) / 2, (y0 + y1) / 2, None)
        assert got == want
        number = page.locator("#frame input[type=number]")
        number.fill(str(f + 1))
        number.press("Enter")
        page.wait_for_function(f"document.querySelector('{sel}').naturalWidth !== {grid_w}")
        page.locator("#panel-0-mask").scroll_into_view_if_needed()
        pic = shown(page, sel)
        fx0, fy0, fx1, fy1 = lay.frame_box(f)
        z = V.zoom_of((fx0, fy0, fx1, fy1))
        assert pic["natural"] == (fx1 - fx0) * z
        assert pic["width"] >= 0.9 * page.locator("#panel-0-mask").bounding_box()["width"] - 20  # the panel's width
        # another patch of the same frame (the last click's is already shown): row 9, col 2
        other = f * 196 + 9 * 14 + 2
        ox0, oy0, ox1, oy1 = (int(v) for v in lay.rects[other])
        got = click_token(page, sel, pic, ((ox0 + ox1) / 2 - fx0) * z, ((oy0 + oy1) / 2 - fy0) * z, got)
        assert got == {"token": other, "frame": f, "row": 9, "col": 2}
        if width > 400:
            evs_panel(page, enc, lay, tmp_path)

    finally:
        page.close()


def evs_panel(page, enc, lay, tmp_path):
    """EVS chosen: its panel maps the dissimilarity over every frame with a colour bar, and its rate is live."""
    grid_w, grid_h = lay.size
    number = page.locator("#frame input[type=number]")
    number.fill("0")
    number.press("Enter")
    page.locator("#methods").get_by_text("EVS (video)").click()
    find = ("() => [...Array(6).keys()].find((i) => /EVS[^\\n]*\\n[^]*tokens kept/.test("
            "(document.querySelector(`#panel-${i}-title`) || {}).innerText || ''))")
    page.wait_for_function(f"({find})() !== undefined")
    i = page.evaluate(f"({find})()")
    title = f"document.querySelector('#panel-{i}-title')"
    heat = page.locator(f"#panel-{i}-heat")
    assert "temporal dissimilarity" in heat.inner_text()
    pic = shown(page, f"#panel-{i}-heat img")
    assert pic["natural"] == grid_w and pic["naturalHeight"] > grid_h  # the grid, its bar underneath
    assert pic["width"] * lay.frame_wh[0][0] / grid_w >= MIN_FRAME_PX
    heat.locator("img").scroll_into_view_if_needed()
    png = heat.locator("img").screenshot()
    (tmp_path / "evs-heat.png").write_bytes(png)
    from PIL import Image

    upright = io.BytesIO()  # the bar turned upright, its low end down: as colour_bar_columns reads bars
    Image.open(io.BytesIO(png)).rotate(90, expand=True).save(upright, format="png")
    assert len(colour_bar_columns(upright.getvalue())) >= 3
    box = page.locator("#budget input[type=number]")  # every token allowed: the rate alone decides
    box.fill("100")
    box.press("Enter")
    page.wait_for_function(f"/{enc.n_visual} \\/ {enc.n_visual} tokens kept/.test({title}.innerText)")
    rate = page.locator("#param-video_pruning_rate input[type=number]")
    rate.fill("0.75")
    rate.press("Enter")
    keep = max(196, int(enc.n_visual * 0.25))  # vLLM's max(one frame, int(T P (1 - q)))
    page.wait_for_function(f"/{keep} \\/ {enc.n_visual} tokens kept/.test({title}.innerText)")
