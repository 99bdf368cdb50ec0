"""On CPU hardware the app reads an image as its base view only where the model's family can (LLaVA-OneVision),
says so on the status line, and reads every view when the visitor unticks "Fewer views for speed"
(components.core.views); on a GPU the default reads every view."""
from __future__ import annotations

import pytest

from components.core.examples import load_examples
from components.core.logic import AppLogic
from components.core.settings import Settings
from components.core.views import FEWER_LABEL, fewer_by_default, views_for
from components.hosting.hub import ModelHub
from components.page.handlers import Handlers, Media, controls_for
from tests.models.tiny_onevision import IMAGE_SIZE, PATCH, save_tiny

IMAGE = next(e for e in load_examples() if e["kind"] == "image")
G = IMAGE_SIZE // PATCH


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    path = save_tiny(str(tmp_path_factory.mktemp("fewer") / "tiny-onevision"))
    hub = ModelHub(path, device="cpu")
    hub.load_default()
    return Handlers(AppLogic(hub, max_new_tokens=2), auto_answers=False), path


def _encode(app, **kw):
    handlers, path = app
    return handlers.encode(None, Media(model=path, image=IMAGE["path"], prompt=IMAGE["prompt"], **kw),
                           controls_for(Settings(methods=("mi", "random"), budget=0.25)))


def test_a_cpu_app_reads_one_view_by_default_and_says_so(app):
    got = _encode(app)  # fewer_views=None: the app's default, as /encode sends
    assert got.state.n_visual == G * G + 1 and got.state.key.views == "base"
    assert "Read as 1 view" in got.status and f'untick "{FEWER_LABEL}"' in got.status


def test_unticking_reads_every_view(app):
    one = _encode(app, fewer_views=True)
    every = _encode(app, fewer_views=False)
    assert every.state.key.views == "all" and every.state.n_visual > one.state.n_visual == G * G + 1
    assert "Read as 1 view" not in every.status
    assert every.state.key != one.state.key  # two encodings in the cache, not one


def test_the_default_follows_the_hardware_and_the_family(app):
    hub = app[0].logic.hub
    assert fewer_by_default(hub) is True
    assert fewer_by_default(ModelHub(device="cuda")) is False  # a GPU (ZeroGPU loads on cuda): every view
    adapter = hub.get(None)[0].adapter
    assert views_for(adapter, "image", True) == "base" and views_for(adapter, "video", True) == "all"
    assert views_for(adapter, "image", False) == "all"


def test_a_family_without_views_reads_every_view(hub):
    """The embedded shapes-llava (LLaVA-1.5: one view) on a CPU: the box changes nothing and the line says nothing."""
    handlers = Handlers(AppLogic(hub, max_new_tokens=2), auto_answers=False)
    got = handlers.encode(None, Media(model="shapes-llava", image=IMAGE["path"], prompt=IMAGE["prompt"]),
                          controls_for(Settings(methods=("mi",), budget=0.25)))
    assert got.state.key.views == "all" and "Read as 1 view" not in got.status


def test_a_text_mode_strip_reads_the_views_on_screen(app):
    """The masks strip's text_mode row re-encodes the picture as the encoding on screen reads it (1 view)."""
    from components.core import sweep_logic as SL

    got = _encode(app)
    logic = app[0].logic
    sw = SL.make_sweep(["mi"], "text_mode", "question,prompt", 4, {}, "question", 4)
    SL.mask_strip(logic, got.state, sw)
    engine = logic.hub.get(None)[0]
    keys = [k for k in got.state.session.entries if k.text_mode == "prompt"]
    assert keys and all(k.views == "base" and engine.encoded(got.state.session, k).n_visual == G * G + 1
                        for k in keys)
