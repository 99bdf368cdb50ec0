"""What the page shows, without a browser: the centre-crop sentence, the start-up note once per session,
the lambda slider's state under each lam rule, a video's single frame, the clicked patch's box, and the
payload checks that name the field (components.page.guards.payload_problem)."""
from __future__ import annotations

import gradio as gr
import pytest
from PIL import Image

from components.core.examples import load_examples
from components.core.logic import AppLogic, UserError
from components.core.settings import Settings
from components.page import controls as C
from components.page import panels as P
from components.core.file_access import not_uploaded, real_roots
from components.page import video as V
from components.page.guards import payload_problem
from mipruner.serve.service import parameters

NOTE = "Could not load 'x/y' because the hub cannot be reached, so the embedded model serves instead."
IMAGE = next(e for e in load_examples() if e["kind"] == "image")
CLIP = next(e for e in load_examples() if e["kind"] == "video")


@pytest.fixture(scope="module")
def logic(hub):
    return AppLogic(hub, max_new_tokens=4, notes=NOTE)


def test_the_centre_crop_is_said_and_the_start_up_note_once(logic, tmp_path):
    wide = tmp_path / "wide.png"
    Image.open(IMAGE["path"]).convert("RGB").resize((448, 224)).save(wide)
    st, first = logic.encode(None, "shapes-llava", "image", str(wide), None, IMAGE["prompt"])
    assert first.endswith(NOTE)
    assert "reads only the centre 224 x 224 px of this 448 x 224 picture" in first
    st, again = logic.encode(st, "shapes-llava", "image", IMAGE["path"], None, IMAGE["prompt"])
    assert NOTE not in again and "reads only the centre" not in again  # a square picture: all of it is read
    _, other = logic.encode(None, "shapes-llava", "image", IMAGE["path"], None, IMAGE["prompt"])
    assert other.endswith(NOTE)  # another session hears it once too


def test_the_lam_slider_is_disabled_under_auto():
    lam = parameters()["lam"]
    assert C.lam_props(lam, "auto")["interactive"] is False and "disabled" in C.lam_props(lam, "auto")["info"]
    assert C.lam_props(lam, "fixed") == {"interactive": True, "info": lam.doc}
    assert C.lam_props(parameters()["tau"], "auto") == {}


def test_one_frame_of_a_video_and_its_clicks(logic):
    st, _ = logic.encode(None, "shapes-llava", "video", None, CLIP["path"], CLIP["prompt"])
    assert st.n_frames == 8
    views, _ = logic.view(st, Settings(methods=("mi", "random"), budget=0.1))
    grid = views[0].mask.size
    x0, y0, x1, y1 = logic.frame_box(st, 2)  # the third frame: first of the second row of two
    assert x0 == 0 and 0 < y0 < grid[1] / 3 and 0 < x1 - x0 < grid[0] / 1.5
    z = V.zoom_of((x0, y0, x1, y1))
    V.show_frame(views, (x0, y0, x1, y1))
    assert views[0].mask.size == views[0].pivot.size == ((x1 - x0) * z, (y1 - y0) * z)
    again, _ = logic.view(st, Settings(methods=("mi", "random"), budget=0.1))
    V.show_frame(again, (x0, y0, x1, y1))
    assert again[0].pivot is views[0].pivot  # the same crop object for the same picture: its file is reused
    with pytest.raises(UserError, match=r"frame must be in \[1, 8\], got 9"):
        logic.frame_box(st, 8)


def test_the_clicked_patch_box():
    up = P.patch_beside([{"token": "red", "class_or_confidence": 1.0}, {"token": "?", "class_or_confidence": 0.0}],
                        12.0, 30.4)
    assert up["visible"] and up["value"] == [("red", 1.0), ("?", 0.0)] and "(12, 30)" in up["label"]
    assert P.patch_beside(None, None, None) == {"__type__": "update", "visible": False}


def test_payloads_are_checked_with_the_field_named(tmp_path):
    img = gr.Image()
    assert payload_problem("image", img, {"path": "https://example.com/a.png"}).startswith(
        "image: this server does not fetch files from the web")
    assert payload_problem("image", img, {"url": "https://example.com/a.png", "path": None}).startswith("image: ")
    cache = tmp_path / "cache"
    cache.mkdir()
    roots = real_roots([cache])
    real, outside = cache / "b.png", tmp_path / "c.png"
    Image.new("RGB", (4, 4)).save(real)
    Image.new("RGB", (4, 4)).save(outside)
    assert payload_problem("image", img, {"path": str(real)}, roots) is None  # in the upload cache
    missing = payload_problem("image", img, {"path": str(cache / "a.png")}, roots)
    assert missing == payload_problem("image", img, {"path": str(outside)}, roots) == not_uploaded("image")
    methods = gr.CheckboxGroup(["mi", "random"])
    assert payload_problem("methods", methods, ["mi"]) is None
    msg = payload_problem("methods", methods, ["mi", "z" * 1000])
    assert msg.startswith("methods: 'zzz") and "z" * 61 not in msg and "(mi, random)" in msg
    lam = gr.Slider(0, 1)
    assert payload_problem("lam", lam, 2) == "lam must be in [0, 1], got 2"
    assert payload_problem("lam", lam, float("inf")) == "lam must be a finite number, got inf"
    assert payload_problem("lam", lam, 0.5) is None and payload_problem("lam", lam, None) is None
