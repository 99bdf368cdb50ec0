"""The app in a real browser (headless Chromium via Playwright): upload an image, type a prompt,
run, move the budget slider and see the mask change; heatmaps carry a colour bar (checked on a
screenshot) labelled with their quantity; the example clip plays; at phone width nothing overflows
and the results come soon after Run.

Needs Debian's `chromium` and the `playwright` package (`.ci/run` installs both and sets
MIPRUNER_REQUIRE_BROWSER=1, so there a missing browser fails instead of skipping).
"""
from __future__ import annotations

import io
import os
import re

import numpy as np

from components.core.examples import load_examples
from mipruner.serve.service import method_specs
from mipruner.viz import colormap_lut


def kept_count(page) -> int:
    text = page.locator("#panel-0-title").inner_text()
    return int(re.search(r"(\d+) / 196 tokens kept", text).group(1))


def test_upload_run_and_move_the_slider(page):
    example = next(e for e in load_examples() if e["kind"] == "image")
    page.set_input_files("#image input[type=file]", example["path"])
    page.fill("#prompt textarea", example["prompt"])
    page.click("#run")
    page.wait_for_selector("#panel-0-mask img")
    page.wait_for_function("document.querySelector('#panel-0-title') && "
                           "/tokens kept/.test(document.querySelector('#panel-0-title').innerText)")
    assert "196 visual tokens" in page.locator("#status").inner_text()
    before_src = page.locator("#panel-0-mask img").get_attribute("src")
    before = kept_count(page)
    assert before == 20  # 10% of 196, rounded half up
    box = page.locator("#budget input[type=number]")
    box.fill("50")
    box.press("Enter")
    page.wait_for_function("/98 \\/ 196 tokens kept/.test(document.querySelector('#panel-0-title').innerText)")
    page.wait_for_function(f"document.querySelector('#panel-0-mask img').src !== {before_src!r}")
    assert kept_count(page) == 98
    # the answer appears automatically on the embedded model
    page.wait_for_function("/Answer:/.test(document.querySelector('#panel-0-answer').innerText)")
    page.screenshot(path=os.environ.get("MIPRUNER_SCREENSHOT", "/tmp/mipruner-app.png"), full_page=True)


def colour_bar_columns(png: bytes) -> list[np.ndarray]:
    """Columns of a screenshot that are a colour bar: >= 70% of their middle pixels on viridis, the
    colormap's index falling from top to bottom over most of its range. Returns their index profiles."""
    from PIL import Image

    arr = np.asarray(Image.open(io.BytesIO(png)).convert("RGB")).astype(int)
    h = arr.shape[0]
    lut = colormap_lut("viridis").astype(int)
    found = []
    for x in range(arr.shape[1] // 2, arr.shape[1]):  # the bar is on the right of a picture
        col = arr[h // 10: h - h // 10, x]
        d = ((col[:, None, :] - lut[None]) ** 2).sum(-1)  # (rows, 256)
        on = np.sqrt(d.min(1)) < 25
        if on.mean() < 0.7:
            continue
        idx = d.argmin(1)[on]
        if idx[0] - idx[-1] > 150 and np.corrcoef(np.arange(len(idx)), idx)[0, 1] < -0.95:
            found.append(idx)
    return found


def test_heatmaps_have_a_colour_bar_with_quantity_and_unit(page):
    by_label = {s.label: s for s in method_specs()}
    seen_no_score = False
    for i in range(6):
        title = page.locator(f"#panel-{i}-title")
        if not title.is_visible():
            continue
        spec = by_label[title.inner_text().splitlines()[0].strip()]
        heat = page.locator(f"#panel-{i}-heat")
        if spec.score_label is None:  # Random: no meaningless map, a note instead
            assert not heat.is_visible()
            assert "has no score map" in page.locator(f"#panel-{i}-legend").inner_text()
            seen_no_score = True
            continue
        assert f"scores: {spec.score_label}" in heat.inner_text()  # quantity (unit) from the registry
        img = heat.locator("img")
        img.scroll_into_view_if_needed()
        page.wait_for_function("(el) => el.complete && el.naturalWidth > 0", arg=img.element_handle())
        png = img.screenshot()
        if i == 0:
            with open(os.environ.get("MIPRUNER_HEAT_SCREENSHOT", "/tmp/mipruner-heat.png"), "wb") as f:
                f.write(png)
        assert len(colour_bar_columns(png)) >= 3, f"no colour bar in panel {i}'s heatmap ({spec.name})"
        # the mask beside it has no bar: the check tells a bar from a picture
        assert not colour_bar_columns(page.locator(f"#panel-{i}-mask img").screenshot())
    assert seen_no_score  # the default methods include one without a score


def test_raw_data_follows_the_view_while_open(page):
    """The view's JSON is its own event, run only while its accordion is open: it follows a move."""
    page.get_by_text("Downloads and raw data").click()
    page.wait_for_function("/0\\.5/.test(document.querySelector('#view-json').innerText)")  # share of 98
    box = page.locator("#budget input[type=number]")
    box.fill("30")
    box.press("Enter")
    page.wait_for_function("/59 \\/ 196 tokens kept/.test(document.querySelector('#panel-0-title').innerText)")
    page.wait_for_function("/0\\.301/.test(document.querySelector('#view-json').innerText)")  # 59 / 196
    page.get_by_text("Downloads and raw data").click()


def test_clicking_a_prompt_word_shows_its_pmi(page):
    title = page.locator("#panel-0-heat").inner_text()
    page.locator("#tokens").get_by_text(re.compile(r"^\s*\?\s*$")).first.click()
    page.wait_for_function("/PMI with/.test(document.querySelector('#panel-0-heat').innerText)")
    assert "PMI with '?'" in page.locator("#panel-0-heat").inner_text()
    assert title != page.locator("#panel-0-heat").inner_text()
    assert "(nats)" in page.locator("#panel-0-heat").inner_text()


def test_the_page_buttons_read_the_controls_it_shows(page):
    """The page's own events read the controls from one boxed value that the page rewrites on each
    change (#controls-json): Apply, Generate, a click on a patch and Make files all act on what the
    controls show, not on their values at page load."""
    auto = page.locator("#auto-answers input")
    if auto.is_checked():
        auto.click()
    page.fill("#settings textarea", "m=mi,random&b=30&ht=-1")
    page.click("#apply")
    page.wait_for_function("/30 \\/ 196 tokens kept/.test(document.querySelector('#panel-0-title').innerText)")
    page.wait_for_function("!document.querySelector('#panel-2-title') || "
                           "!document.querySelector('#panel-2-title').offsetParent")  # two panels left
    boxed = page.evaluate("JSON.parse(document.querySelector('#controls-json textarea').value)")
    assert boxed[0] == ["mi", "random"] and boxed[1] == "tokens" and boxed[2] == 30
    assert "press Generate" in page.locator("#panel-1-answer").inner_text()
    page.click("#generate")
    page.wait_for_function("/\\(30 visual\\)/.test(document.querySelector('#panel-1-answer').innerText)")
    page.get_by_text("Inspect a patch").click()
    page.locator("#panel-0-mask img").click(position={"x": 20, "y": 20})
    page.wait_for_function("/kept_by/.test(document.querySelector('#patch-info').innerText)")
    info = page.locator("#patch-info").inner_text()
    assert "similarity" not in info and "attention" not in info  # only the methods now chosen
    page.get_by_text("Downloads and raw data").click()
    page.click("#export")
    page.wait_for_selector('#files td.filename[aria-label="random_mask.png"]')
    files = page.eval_on_selector_all("#files td.filename", "(tds) => tds.map((t) => t.getAttribute('aria-label'))")
    assert "mi_selection.json" in files and not any("similarity" in f for f in files)
    auto.click()  # as the other tests found it
    page.get_by_text("Downloads and raw data").click()


def test_phone_width_fits_and_results_follow_run(page, tmp_path):
    """390 px wide: no horizontal overflow (the examples table included), the results start within
    a screen or so of Run, and a 1-frame video says "1 frame"."""
    from PIL import Image

    from components.core.examples import VIDEO_CODEC
    from mipruner.media import write_video

    clip = write_video([Image.open(load_examples()[0]["path"]).resize((224, 224))], str(tmp_path / "one.mp4"),
                       codec=VIDEO_CODEC)  # a codec the browser plays: no "Video not playable" toast
    phone = page.context.browser.new_page(viewport={"width": 390, "height": 844})
    phone.set_default_timeout(60_000)
    try:
        phone.goto(page.url)
        phone.wait_for_selector("#run")
        phone.locator("#use").get_by_text("video").click()  # Use shows its tab
        phone.wait_for_selector("#video input[type=file]", state="attached")
        phone.set_input_files("#video input[type=file]", clip)
        phone.fill("#prompt textarea", load_examples()[0]["prompt"])
        phone.click("#run")
        phone.wait_for_function("/tokens kept/.test((document.querySelector('#panel-0-title') || {}).innerText)")
        status = phone.locator("#status").inner_text()
        assert "1 frame ->" in status and "1 frames" not in status
        assert phone.evaluate("document.documentElement.scrollWidth") <= 390
        widest = phone.evaluate("Math.max(...Array.from(document.querySelectorAll('#examples *'))"
                                ".map(e => e.getBoundingClientRect().right))")
        assert widest <= 390
        top = lambda sel: phone.evaluate(  # noqa: E731
            f"document.querySelector('{sel}').getBoundingClientRect().top + window.scrollY")
        run_bottom = top("#run") + phone.locator("#run").bounding_box()["height"]
        assert top("#status") - run_bottom < 900  # after the examples, not after every control
        assert top("#panel-0-title") - run_bottom < 1200
        # the controls: a sheet fixed to the bottom of the screen, in reach wherever the page is scrolled
        sheet = phone.locator("#controls-col").bounding_box()
        assert phone.evaluate("getComputedStyle(document.querySelector('#controls-col')).position") == "fixed"
        assert abs(sheet["y"] + sheet["height"] - 844) <= 1 and sheet["height"] <= 0.35 * 844
        path = os.environ.get("MIPRUNER_PHONE_SCREENSHOT", "/tmp/mipruner-phone.png")
        phone.screenshot(path=path, full_page=True)
        from PIL import Image as I

        assert I.open(path).width == 390  # a full-page screenshot is as wide as the page
    finally:
        phone.close()


def test_video_example_plays_and_shows_its_tab(page):
    page.goto(page.url)
    page.wait_for_selector("#run")
    clip = next(e for e in load_examples() if e["kind"] == "video")
    page.locator("#examples").get_by_text(clip["prompt"]).click()
    page.wait_for_selector("#video video")
    assert page.locator("#use input:checked").get_attribute("value") == "video"
    assert page.locator("#video").is_visible() and not page.locator("#image").is_visible()  # the Video tab shows
    page.evaluate("document.querySelector('#video video').muted = true")
    page.evaluate("document.querySelector('#video video').play()")
    page.wait_for_function("document.querySelector('#video video').currentTime > 0.2")
    state = page.evaluate("(() => { const v = document.querySelector('#video video');"
                          " return [v.readyState, v.error && v.error.code, v.videoWidth]; })()")
    assert state[0] >= 2 and state[1] is None and state[2] > 0  # decoded: no MEDIA_ERR_SRC_NOT_SUPPORTED (4)
    from PIL import Image

    shot = np.asarray(Image.open(io.BytesIO(page.locator("#video video").screenshot())).convert("L"))
    assert shot.std() > 10  # frames, not a blank box
    page.click("#run")
    page.wait_for_function("/8 frames/.test(document.querySelector('#status').innerText)")
