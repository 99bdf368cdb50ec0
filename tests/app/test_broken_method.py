"""Through the app's API (gradio_client): a method that raises on this input shows its sentence in its
own panel, and every other panel renders; /generate answers the others."""
from __future__ import annotations

import pytest

from ..conftest import raising_method
from .test_app_client import ctl, encode
from components.core.examples import load_examples


@pytest.fixture(scope="module")
def boom():
    yield from raising_method("boom_app_test", "boom in the app")


@pytest.fixture(scope="module")
def client(boom, app_url):  # the method is registered before the app is built
    from gradio_client import Client

    return Client(app_url, verbose=False)


def test_view_returns_every_other_panel_and_the_sentence(client, boom):
    example = load_examples()[0]
    encode(client, example, methods=("mi", boom, "random"), budget=16)
    out = client.predict(*ctl(methods=("mi", boom, "random"), budget=16), api_name="/view")
    summary = out[-2]
    assert summary["methods"][1] == {"method": boom, "error": "'boom_app_test' failed: RuntimeError: boom in the app"}
    assert [(m["method"], m["kept"]) for i, m in enumerate(summary["methods"]) if i != 1] == [("mi", 16), ("random", 16)]
    texts = [x for x in out if isinstance(x, (str, dict))]
    titles = [t.get("value") if isinstance(t, dict) else t for t in texts]
    assert any(isinstance(t, str) and "Failed on this input" in t and "boom in the app" in t for t in titles)
