"""One app server per test module, on the embedded model (assets/shapes-llava), on a free port."""
from __future__ import annotations

import os
import socket

import pytest

from mipruner.models import resolve


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def hub():
    from components.hub import ModelHub

    if not os.path.exists(os.path.join(resolve("shapes-llava"), "config.json")):
        pytest.fail("assets/shapes-llava is missing: the app tests need the embedded model")
    h = ModelHub("shapes-llava", device="cpu")
    h.load_default()
    return h


@pytest.fixture(scope="module")
def app_url(hub):
    from components.logic import AppLogic
    from components.ui import build_demo, launch_kwargs

    demo = build_demo(AppLogic(hub, max_new_tokens=4), auto_answers=True)
    port = free_port()
    demo.queue().launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True,
                        **launch_kwargs())
    yield f"http://127.0.0.1:{port}/"
    demo.close()
