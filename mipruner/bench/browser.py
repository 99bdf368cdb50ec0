"""`python -m mipruner.bench browser`: how live a slider move feels in a real browser.

Starts the app (`app.py`, its own process) on the embedded model (`shapes-llava`) on 127.0.0.1, or
drives `--url`; opens it in headless Chromium through Playwright, runs the first example image with
the default methods (4), then moves the budget slider `--moves` times and reports, per setting of
"Answer automatically":

  panels   input event -> every method panel shows the new kept count AND every image in it
           (mask, heatmap, pivot map) is loaded, the mask being a new one; timed in the page
           (`performance.now()` before the slider's input event, polled each animation frame)
  answers  input event -> every panel's answer names the new visual-token count ("auto" on only)

Each move waits until the page has settled (answers in, 250 ms idle) before the next, so a move
never queues behind the previous one; values are drawn from a seeded generator, each differs from
the previous. Goal (issue 17): panels p50 <= 120 ms, p95 <= 250 ms. This is a benchmark, not a test:
figures depend on the machine and its load (`--threads 1` keeps torch off the second core).

    python -m mipruner.bench browser [--moves 40] [--auto off|on|both] [--url http://...]
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import time
import urllib.request

from .timing import table

GOAL_P50_MS, GOAL_P95_MS = 120.0, 250.0
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLES = os.path.join(ROOT, "assets", "examples")

# Resolves to the ms from the slider's input event until `done()` holds (checked every frame).
MOVE_JS = """async ([value, n, k, before, waitAnswers]) => {
  // textContent and `complete` only: innerText / offsetParent would force a layout every frame
  const q = (s) => document.querySelector(s);
  const range = q('#budget input[type=range]');
  const loaded = (img) => img && img.complete && img.naturalWidth > 0;
  const panelsDone = () => {
    for (let i = 0; i < n; i++) {
      const t = q(`#panel-${i}-title`);
      if (!t || !t.textContent.includes(`${k} / `)) return false;
      const mask = q(`#panel-${i}-mask img`);
      if (!loaded(mask) || mask.src === before[i]) return false;
      for (const w of ['heat', 'pivot']) {  // hidden components are not in the page
        const box = q(`#panel-${i}-${w}`);
        if (box && box.querySelector('img') && !loaded(box.querySelector('img'))) return false;
      }
    }
    return true;
  };
  const answersDone = () => {
    for (let i = 0; i < n; i++) {
      const a = q(`#panel-${i}-answer`);
      if (!a || !a.textContent.includes(`(${k} visual)`)) return false;
    }
    return true;
  };
  const frame = () => new Promise((r) => requestAnimationFrame(() => r(performance.now())));
  const t0 = performance.now();
  range.value = String(value);
  range.dispatchEvent(new Event('input', {bubbles: true}));
  let panels = null, answers = null;
  while (performance.now() - t0 < 30000) {
    const t = await frame();
    if (panels === null && panelsDone()) panels = t - t0;
    if (waitAnswers && answers === null && answersDone()) answers = t - t0;
    if (panels !== null && (!waitAnswers || answers !== null)) break;
  }
  const state = Array.from({length: n}, (_, i) => [(q(`#panel-${i}-title`) || {}).textContent,
    (q(`#panel-${i}-mask img`) || {}).src === before[i], (q(`#panel-${i}-answer`) || {}).textContent]);
  return [panels, answers, JSON.stringify(state)];
}"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(threads: int = 1, max_new_tokens: int = 4, timeout_s: float = 300.0):
    """`python app.py` on the embedded model on a free loopback port: (url, process)."""
    port = _free_port()
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    proc = subprocess.Popen([sys.executable, os.path.join(ROOT, "app.py"), "--model", "shapes-llava", "--device", "cpu",
                             "--host", "127.0.0.1", "--port", str(port), "--max-new-tokens", str(max_new_tokens)],
                            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/"
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        if proc.poll() is not None:
            raise RuntimeError(f"app.py exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=5):
                return url, proc
        except OSError:
            time.sleep(1.0)
    proc.kill()
    raise RuntimeError(f"app.py did not answer on {url} within {timeout_s:.0f} s")


def first_example_image() -> tuple[str, str]:
    """(path, prompt) of the first shipped example image (assets/examples/index.json)."""
    with open(os.path.join(EXAMPLES, "index.json")) as f:
        row = next(r for r in json.load(f)["examples"] if r["kind"] == "image")
    return os.path.join(EXAMPLES, row["file"]), row["prompt"]


def _kept(percent: int, n_visual: int) -> int:
    return max(1, int(percent * n_visual / 100 + 0.5))  # = resolve_budget(share) of the library


def _pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1] if len(values) > 1 else values[0]


def run(page, moves: int, auto: bool, seed: int = 0) -> tuple[list[float], list[float]]:
    """Move the budget `moves` times; (panel latencies, answer latencies) in ms."""
    import re

    if page.locator("#auto-answers input").is_checked() != auto:
        page.locator("#auto-answers input").click()
    n = sum(1 for i in range(6) if page.locator(f"#panel-{i}-title").is_visible())
    n_visual = int(re.search(r"(\d+) visual tokens", page.locator("#status").inner_text()).group(1))
    rng = random.Random(seed)
    current = int(float(page.locator("#budget input[type=number]").input_value()))
    panels, answers = [], []
    for _ in range(moves):
        value = current
        while _kept(value, n_visual) == _kept(current, n_visual):
            value = rng.randint(2, 60)
        before = [page.locator(f"#panel-{i}-mask img").get_attribute("src") for i in range(n)]
        p_ms, a_ms, state = page.evaluate(MOVE_JS, [value, n, _kept(value, n_visual), before, auto])
        if p_ms is None or (auto and a_ms is None):
            raise RuntimeError(f"the page did not update within 30 s after a move to {value}%: {state}")
        panels.append(p_ms)
        if auto:
            answers.append(a_ms)
        current = value
        page.wait_for_timeout(250)
    return panels, answers


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m mipruner.bench browser", description=__doc__.split("\n\n")[0])
    ap.add_argument("--moves", type=int, default=40, help="slider moves per setting (default 40)")
    ap.add_argument("--auto", choices=("off", "on", "both"), default="both", help="'Answer automatically' setting(s)")
    ap.add_argument("--url", default=None, help="a running app to drive instead of starting one (embedded model)")
    ap.add_argument("--chromium", default=shutil.which("chromium") or "/usr/bin/chromium")
    ap.add_argument("--threads", type=int, default=1, help="OMP threads of the started server (default 1)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    from playwright.sync_api import sync_playwright

    proc = None
    url = args.url
    if url is None:
        url, proc = start_server(args.threads)
    image, prompt = first_example_image()
    rows, n = [], 0
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=args.chromium, headless=True,
                                        args=["--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"])
            # tall enough that every panel is on screen: panel images load lazily (only when visible)
            page = browser.new_page(viewport={"width": 1400, "height": 4000})
            page.set_default_timeout(120_000)
            page.goto(url)
            page.wait_for_selector("#run")
            page.set_input_files("#image input[type=file]", image)
            page.fill("#prompt textarea", prompt)
            page.click("#run")
            page.wait_for_function("/tokens kept/.test((document.querySelector('#panel-0-title') || {}).innerText)")
            page.wait_for_timeout(1000)
            n = sum(1 for i in range(6) if page.locator(f"#panel-{i}-title").is_visible())
            for auto in {"off": [False], "on": [True], "both": [False, True]}[args.auto]:
                t0 = time.perf_counter()
                panels, answers = run(page, args.moves, auto, args.seed)
                wall = time.perf_counter() - t0
                for what, vals in (("panels", panels), ("answers", answers)):
                    if vals:
                        rows.append([f"auto {'on' if auto else 'off'}: {what}", str(len(vals)),
                                     f"{_pct(vals, 50):.0f}", f"{_pct(vals, 95):.0f}", f"{min(vals):.0f}",
                                     f"{max(vals):.0f}"])
                print(f"auto {'on' if auto else 'off'}: {args.moves} moves in {wall:.1f} s", flush=True)
            browser.close()
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=30)
    print(f"\nslider -> all {n} panels updated (ms, in the page), {os.path.basename(image)}, embedded model; "
          f"goal p50 <= {GOAL_P50_MS:.0f}, p95 <= {GOAL_P95_MS:.0f}")
    print(table(rows, ["", "moves", "p50", "p95", "min", "max"]))


if __name__ == "__main__":
    main()
