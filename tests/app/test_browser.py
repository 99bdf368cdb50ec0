"""The app in a real browser (headless Chromium via Playwright): upload an image, type a prompt,
run, move the budget slider and see the mask change.

Needs Debian's `chromium` and the `playwright` package (`.ci/run` installs both and sets
MIPRUNER_REQUIRE_BROWSER=1, so there a missing browser fails instead of skipping).
"""
from __future__ import annotations

import os
import re
import shutil

import pytest

from components.examples import load_examples

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


def _browser_missing() -> str:
    try:
        import playwright  # noqa: F401
    except ImportError:
        return "the playwright package is not installed"
    if not os.path.exists(CHROMIUM):
        return "chromium is not installed"
    return ""


@pytest.fixture(scope="module")
def page(app_url):
    missing = _browser_missing()
    if missing:
        if os.environ.get("MIPRUNER_REQUIRE_BROWSER"):
            pytest.fail(missing)
        pytest.skip(missing)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True,
                                    args=["--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                                          "--disable-background-networking", "--no-first-run"])
        pg = browser.new_page(viewport={"width": 1400, "height": 1000})
        pg.set_default_timeout(60_000)
        pg.goto(app_url)
        pg.wait_for_selector("#run")
        yield pg
        browser.close()


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


def test_clicking_a_prompt_word_shows_its_pmi(page):
    title = page.locator("#panel-0-heat").inner_text()
    page.locator("#tokens").get_by_text(re.compile(r"^\s*\?\s*$")).first.click()
    page.wait_for_function("/PMI with/.test(document.querySelector('#panel-0-heat').innerText)")
    assert "PMI with '?'" in page.locator("#panel-0-heat").inner_text()
    assert title != page.locator("#panel-0-heat").inner_text()
