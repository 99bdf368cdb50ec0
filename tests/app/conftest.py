"""One app server per test module, on the embedded model (assets/shapes-llava), on a free port; the pieces the
app's tests share: a page served in this process (`launched`), a call queued as the page sends it (`queue_call`,
`ApiSession`), and a headless Chromium (`chromium`, the `browser` and `page` fixtures, `open_page`)."""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import uuid

import pytest

from mipruner.models import resolve


ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def app_process(args: list[str], env: dict, log_path):
    """`python app.py --port P *args` in the repository with `env`, its output in `log_path`; yields a
    gradio_client Client once the app answers (the log in the failure when it exits or 300 s pass);
    the process is stopped afterwards."""
    from gradio_client import Client

    port = free_port()
    log = open(log_path, "w")
    proc = subprocess.Popen([sys.executable, "app.py", "--port", str(port), *args], cwd=ROOT, env=env, stdout=log,
                            stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 300
        while True:
            try:
                client = Client(f"http://127.0.0.1:{port}/", verbose=False)
                break
            except Exception:
                if proc.poll() is not None or time.monotonic() > deadline:
                    log.close()
                    raise AssertionError(open(log_path).read()) from None
                time.sleep(1)
        yield client
    finally:
        proc.terminate()
        proc.wait(timeout=60)
        log.close()


@pytest.fixture(scope="module")
def hub():
    from components.hosting.hub import ModelHub

    if not os.path.exists(os.path.join(resolve("shapes-llava"), "config.json")):
        pytest.fail("assets/shapes-llava is missing: the app tests need the embedded model")
    h = ModelHub("shapes-llava", device="cpu")
    h.load_default()
    return h


@pytest.fixture(scope="module")
def handlers(hub):
    """The page's handlers around the embedded model (2 new tokens an answer, answers automatic)."""
    from components.core.logic import AppLogic
    from components.page.handlers import Handlers

    return Handlers(AppLogic(hub, max_new_tokens=2), auto_answers=True)


@contextlib.contextmanager
def launched(logic, **build):
    """`build_demo(logic, **build)` queued and launched in this process on a free port; yields its URL and
    closes it afterwards."""
    from components.page.ui import build_demo, launch_kwargs

    demo = build_demo(logic, **build)
    port = free_port()
    demo.queue().launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True,
                        **launch_kwargs())
    try:
        yield f"http://127.0.0.1:{port}/"
    finally:
        demo.close()


@pytest.fixture(scope="module")
def app_url(hub):
    from components.core.logic import AppLogic

    with launched(AppLogic(hub, max_new_tokens=4), auto_answers=True) as url:
        yield url


# ------------------------------------------------------------------ calls as the page sends them

def queue_call(http, url: str, session: str, fn_index: int, data: list, timeout: float = 60) -> tuple[bool, object]:
    """(success, output data | error message) of event `fn_index` called with `data` (any JSON, NaN and
    Infinity included) through Gradio's queue in session `session`, as the page sends it; `http` is httpx
    or an httpx.Client."""
    body = json.dumps({"data": data, "fn_index": fn_index, "session_hash": session, "event_data": None,
                       "trigger_id": None}, allow_nan=True)
    r = http.post(url + "gradio_api/queue/join", content=body, headers={"content-type": "application/json"},
                  timeout=timeout)
    r.raise_for_status()
    event = r.json()["event_id"]
    with http.stream("GET", url + "gradio_api/queue/data", params={"session_hash": session}, timeout=timeout) as s:
        for line in s.iter_lines():
            if line.startswith("data:"):
                msg = json.loads(line[5:])
                if msg.get("event_id") == event and msg.get("msg") == "process_completed":
                    out = msg.get("output") or {}
                    return bool(msg.get("success")), out.get("data") if msg.get("success") else out.get("error")
    raise AssertionError(f"no answer from event {fn_index}")


class ApiSession:
    """Calls by api_name with any JSON, queued in one session (`session_hash`, a fresh one by default): `fn`
    (api_name -> event index, every event), and for the public endpoints their inputs' `defaults` and `labels`,
    from the app's config read once."""

    def __init__(self, url: str, session_hash: str | None = None, timeout: float = 60):
        import httpx

        self.http, self.url, self.timeout = httpx, url.rstrip("/") + "/", timeout
        self.session = session_hash or uuid.uuid4().hex[:11]
        cfg = httpx.get(self.url + "config", timeout=30).json()
        comps = {c["id"]: c for c in cfg["components"]}
        self.fn = {d.get("api_name"): d.get("id", i) for i, d in enumerate(cfg["dependencies"])}
        self.deps = {d["api_name"]: d for d in cfg["dependencies"] if d.get("api_visibility", "public") != "private"}
        self.defaults = {a: [comps[c]["props"].get("value") for c in d["inputs"]] for a, d in self.deps.items()}
        self.labels = {a: [comps[c]["props"].get("label") for c in d["inputs"]] for a, d in self.deps.items()}

    def call(self, api: str, data: list, timeout: float | None = None) -> tuple[bool, object]:
        """(success, output data | error message) of `api` called with exactly `data`."""
        return queue_call(self.http, self.url, self.session, self.fn[api], data, timeout or self.timeout)


# ------------------------------------------------------------------ a real browser

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


def browser_missing() -> str:
    """Why no browser test can run here ("" when Playwright and Chromium are both installed)."""
    try:
        import playwright  # noqa: F401
    except ImportError:
        return "the playwright package is not installed"
    if not os.path.exists(CHROMIUM):
        return "chromium is not installed"
    return ""


def require_browser() -> None:
    """Skip the test where Playwright or Chromium is missing (fail on CI: MIPRUNER_REQUIRE_BROWSER)."""
    missing = browser_missing()
    if missing:
        if os.environ.get("MIPRUNER_REQUIRE_BROWSER"):
            pytest.fail(missing)
        pytest.skip(missing)


@contextlib.contextmanager
def chromium():
    """Debian's Chromium, headless under Playwright; where it is missing the test skips (`require_browser`)."""
    require_browser()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True,
                                    args=["--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                                          "--disable-background-networking", "--no-first-run"])
        try:
            yield browser
        finally:
            browser.close()


def open_page(browser, url: str, width: int, height: int = 900, timeout: int = 60_000, **context):
    """A new page of `width` x `height` px (`context`: Playwright's other context options, permissions say)
    on `url`, once the page has its Run button."""
    page = browser.new_page(viewport={"width": width, "height": height}, **context)
    page.set_default_timeout(timeout)
    page.goto(url)
    page.wait_for_selector("#run")
    return page


def run_clip(page, clip: dict, frames: int = 8) -> None:
    """On an open page: choose video, upload `clip` (an example's path and prompt), press Run, and wait until
    the status says it read `frames` frames (the app's default sampling of the example clip)."""
    page.locator("#use").get_by_text("video").click()
    page.wait_for_selector("#video input[type=file]", state="attached")
    page.set_input_files("#video input[type=file]", clip["path"])
    page.fill("#prompt textarea", clip["prompt"])
    page.click("#run")
    page.wait_for_function(f"/{frames} frames/.test(document.querySelector('#status').innerText)")


@pytest.fixture(scope="module")
def browser():
    with chromium() as b:
        yield b


@pytest.fixture(scope="module")
def page(browser, app_url):
    """One 1,400 x 1,000 page on the module's app server (`app_url`), for the whole module."""
    yield open_page(browser, app_url, 1400, 1000)
