"""The Sweep area in a real browser (headless Chromium via Playwright, the `page` fixture of tests/app/conftest.py):
a small budget sweep for three methods on the embedded model shows its curves and a CSV download;
a long one stops on Cancel with a partial result."""
from __future__ import annotations

import re


def open_sweep(pg) -> None:
    if not pg.locator("#sweep-run").is_visible():
        pg.get_by_text("Sweep: one parameter over a question set").first.click()
    pg.wait_for_selector("#sweep-run", state="visible")


def test_budget_sweep_for_three_methods_shows_curves_and_csv(page):
    open_sweep(page)
    checked = page.locator("#sweep-methods input[type=checkbox]:checked")
    assert checked.count() == 3  # MI-Pruner, Random, Similarity by default
    page.fill("#sweep-values textarea", "4,16")
    page.fill("#sweep-n input", "6")
    page.locator("#sweep-n input").press("Tab")
    page.click("#sweep-run")
    page.wait_for_function("/Sweep done/.test(document.querySelector('#sweep-status').innerText)", timeout=180_000)
    status = page.locator("#sweep-status").inner_text()
    assert re.search(r"6 items of pope \(seed 1234\), 3 methods x 2 values of budget", status)
    plot = page.locator("#sweep-plot img")
    plot.wait_for(state="visible")
    assert plot.evaluate("img => img.complete && img.naturalWidth > 600")
    csv_link = page.locator('#sweep-files a[download="sweep-budget.csv"]')
    csv_link.wait_for()
    with page.expect_download() as dl:
        csv_link.click()
    path = dl.value.path()
    head = open(path).read().splitlines()
    assert head[0].startswith("method,label,param,value,split") and any(ln.startswith("similarity,") for ln in head)
    # re-plotting against mean tokens kept is instant: no new sweep, a new picture
    before = plot.get_attribute("src")
    page.get_by_label("mean tokens kept").check()
    page.wait_for_function(f"document.querySelector('#sweep-plot img') && "
                           f"document.querySelector('#sweep-plot img').src !== {before!r}")


def test_cancel_stops_a_long_sweep(page):
    open_sweep(page)
    page.fill("#sweep-values textarea", "2,3,5,7,11,13")
    page.fill("#sweep-n input", "300")
    page.locator("#sweep-n input").press("Tab")
    page.click("#sweep-run")
    page.wait_for_function("/Sweeping: [1-9]/.test(document.querySelector('#sweep-status').innerText)",
                           timeout=120_000)
    page.click("#sweep-cancel")
    page.wait_for_function("/cancelled: partial result/.test(document.querySelector('#sweep-status').innerText)",
                           timeout=120_000)
    done = int(re.search(r"(\d+) items of pope", page.locator("#sweep-status").inner_text()).group(1))
    assert 1 <= done < 300


def test_choosing_another_parameter_fills_in_its_values(page):
    """The visitor's own choice of parameter fills in that parameter's default values (and only that choice:
    values typed before it are never written over by the page itself)."""
    from components.core.sweep_logic import default_values

    open_sweep(page)
    page.fill("#sweep-values textarea", "3,5")
    page.locator("#sweep-param input").click()
    page.get_by_role("option", name=re.compile(r"^tau: ")).click()
    want = default_values("tau")
    page.wait_for_function(f"document.querySelector('#sweep-values textarea').value === {want!r}")
