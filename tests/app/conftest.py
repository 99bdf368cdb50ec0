"""One app server per test module, on the embedded model (assets/shapes-llava), on a free port."""
from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time

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
def app_url(hub):
    from components.core.logic import AppLogic
    from components.page.ui import build_demo, launch_kwargs

    demo = build_demo(AppLogic(hub, max_new_tokens=4), auto_answers=True)
    port = free_port()
    demo.queue().launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True,
                        **launch_kwargs())
    yield f"http://127.0.0.1:{port}/"
    demo.close()
