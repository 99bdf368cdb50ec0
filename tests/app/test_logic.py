"""The app's handlers without a browser: inputs, errors, views, inspection, export, model fallback."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest
from PIL import Image

from components.core.examples import load_examples
from components.core.logic import AppLogic, UIState, UserError, budget_of, probe_video
from components.core.settings import Settings
from components.hosting.hub import ModelHub
from components.page.controls import control_names, control_values, settings_from
from mipruner.media import write_video

EXAMPLE = next(e for e in load_examples() if e["kind"] == "image")


@pytest.fixture(scope="module")
def logic(hub):
    return AppLogic(hub, max_new_tokens=4)


@pytest.fixture()
def encoded(logic):
    st, msg = logic.encode(None, "shapes-llava", "image", EXAMPLE["path"], None, EXAMPLE["prompt"])
    return st


def test_examples_are_shipped_with_prompts():
    rows = load_examples()
    assert sum(r["kind"] == "image" for r in rows) >= 3 and any(r["kind"] == "video" for r in rows)
    for r in rows:
        assert os.path.exists(r["path"]) and r["prompt"].strip()


def test_budget_units():
    assert budget_of(10, "%", 196) == pytest.approx(0.1)
    assert budget_of(196, "tokens", 196) == 196 and budget_of(500, "tokens", 0) == 500  # N_V unknown: the view checks
    assert budget_of(12.4, "tokens", 196) == 12
    for bad in [(0, "%"), (101, "%"), (0, "tokens"), (None, "%"), (197, "tokens"), (10_000, "tokens")]:
        with pytest.raises(UserError):
            budget_of(bad[0], bad[1], 196)


def test_settings_from_controls_round_trip():
    s = Settings(methods=("mi", "cdpruner"), budget=32, lam=0.25, tau=0.2, aggregation="mean",
                 normalization="minmax", seed=3, theta=0.7, dominant_ratio=0.5, ratio=0.25, split=0.4, heat=2)
    vals = control_values(s, 196)
    assert len(vals) == len(control_names())
    assert settings_from(*vals, n_visual=196) == s
    s2 = Settings(budget=0.25)
    assert settings_from(*control_values(s2, 196), n_visual=196) == s2
    with pytest.raises(UserError, match="at least one method"):
        settings_from([], *control_values(s, 196)[1:])
    with pytest.raises(UserError, match="at most"):
        settings_from(["mi", "random", "similarity", "attention", "divprune", "cdpruner", "visionzip"],
                      *control_values(s, 196)[1:])


def test_encode_reports_geometry(logic, encoded):
    assert encoded.n_visual == 196 and encoded.key is not None
    assert encoded.tokens == EXAMPLE["prompt"].replace("?", " ?").split()


@pytest.mark.parametrize("case", ["empty prompt", "no image", "not an image", "empty video", "no video stream"])
def test_encode_errors_are_plain(logic, tmp_path, case):
    bad = tmp_path / "bad.png"
    bad.write_text("this is not a picture")
    empty_video = tmp_path / "empty.mp4"
    empty_video.write_bytes(b"")
    kw = dict(model="shapes-llava", kind="image", image=EXAMPLE["path"], video=None, prompt="what color?")
    if case == "empty prompt":
        kw["prompt"], match = "   ", "prompt is empty"
    elif case == "no image":
        kw["image"], match = None, "no image given"
    elif case == "not an image":
        kw["image"], match = str(bad), "cannot read image"
    elif case == "empty video":
        kw.update(kind="video", video=str(empty_video)); match = "cannot read video"
    else:
        txt = tmp_path / "clip.mp4"
        txt.write_text("no stream here")
        kw.update(kind="video", video=str(txt)); match = "cannot read video|no video stream"
    with pytest.raises(UserError, match=match):
        logic.encode(None, **kw)


def test_video_frame_limit(tmp_path, monkeypatch):
    import components.core.checks as L

    frames = [Image.fromarray(np.full((32, 32, 3), 40 * i, np.uint8)) for i in range(6)]
    path = write_video(frames, tmp_path / "six.mp4", fps=4)
    assert probe_video(path) == 6
    monkeypatch.setattr(L, "MAX_VIDEO_FRAMES", 5)
    with pytest.raises(UserError, match="at most 5"):
        probe_video(path)


def test_video_on_the_embedded_model_shows_a_grid_of_frames(logic):
    clip = next(e for e in load_examples() if e["kind"] == "video")
    st, msg = logic.encode(None, "shapes-llava", "video", None, clip["path"], clip["prompt"])
    assert "8 frames" in msg and st.n_visual == 8 * 196
    views, summary = logic.view(st, Settings(methods=("mi", "random", "fastv"), budget=0.1))
    assert [m["kept"] for m in summary["methods"]] == [157, 157, 157]
    w, h = views[0].mask.size
    assert 1.5 * w < h < 2.5 * w  # eight frames two a row: four rows of two (mipruner.viz.video.video_layout)
    out = logic.generate(st, Settings(methods=("mi",), budget=0.1), 4)
    assert out["methods"]["mi"]["visual_tokens"] == 157 and out["reference"]["visual_tokens"] == 1568


def test_view_before_encode_says_what_to_do(logic):
    with pytest.raises(UserError, match="run the model first"):
        logic.view(UIState(), Settings())


def test_view_panels_follow_settings(logic, encoded):
    views, summary = logic.view(encoded, Settings(methods=("mi", "random", "attention"), budget=16))
    assert [v.method for v in views] == ["mi", "random", "attention"]
    for v, row in zip(views, summary["methods"]):
        assert v.kept == 16 == len(row["keep"]) and row["keep"] == v.selection.keep.tolist()
        assert v.mask.size == views[0].mask.size
    assert views[0].pivot is not None and views[1].pivot is None  # pivot maps for MI only
    views2, _ = logic.view(encoded, Settings(methods=("mi",), budget=40))
    assert views2[0].kept == 40
    # a heat token switches MI's heatmap to that token's PMI column
    views3, summary3 = logic.view(encoded, Settings(methods=("mi",), budget=16, heat=1))
    assert summary3["heat_token"] == encoded.tokens[1] and "PMI" in views3[0].heat_title
    assert np.asarray(views3[0].heatmap).tolist() != np.asarray(views[0].heatmap).tolist()


def test_inspect_returns_pmi_of_the_clicked_patch(logic, encoded):
    from mipruner import viz

    s = Settings(methods=("mi", "random"), budget=20)
    views, _ = logic.view(encoded, s)
    kept = views[0].selection.keep.tolist()
    engine = logic.hub.get("shapes-llava")[0]
    lay = engine.layout(encoded.session, encoded.key)
    x0, y0, x1, y1 = lay.rects[kept[0]]
    info = logic.inspect(encoded, s, (x0 + x1) / 2, (y0 + y1) / 2)
    assert info["token"] == kept[0] and "mi" in info["kept_by"]
    assert [t for t, _ in info["pmi"]] == encoded.tokens
    enc = engine.encoded(encoded.session, encoded.key)
    expect = viz.pmi_row(enc, views[0].selection, kept[0])
    assert [round(v, 5) for _, v in expect] == [v for _, v in info["pmi"]]
    assert info["pivot"] == encoded.tokens[int(np.argmax([v for _, v in expect]))]
    with pytest.raises(UserError, match="no visual token"):
        logic.inspect(encoded, s, -5, -5)


def test_export_writes_pngs_and_json(logic, encoded, tmp_path):
    paths = logic.export(encoded, Settings(methods=("mi", "similarity"), budget=10), str(tmp_path))
    names = sorted(os.path.basename(p) for p in paths)
    assert names == sorted(["mi_mask.png", "mi_heatmap.png", "mi_pivots.png", "mi_selection.json",
                            "similarity_mask.png", "similarity_heatmap.png", "similarity_selection.json",
                            "view.json"])
    doc = json.load(open(tmp_path / "mi_selection.json"))
    assert doc["kept"] == 10 and len(doc["keep"]) == 10 and len(doc["pmi"]) == 196
    Image.open(tmp_path / "mi_mask.png").verify()


def test_generate_reference_and_methods(logic, encoded):
    s = Settings(methods=("mi", "random"), budget=20)
    assert logic.cached_answers(encoded, s, 4)["reference"] is None
    out = logic.generate(encoded, s, 4)
    assert out["reference"]["visual_tokens"] == 196
    assert {m: a["visual_tokens"] for m, a in out["methods"].items()} == {"mi": 20, "random": 20}
    assert logic.cached_answers(encoded, s, 4) == out


def test_hub_falls_back_to_the_embedded_model():
    import mipruner

    calls = []

    def loader(name, device, dtype):
        calls.append(name)
        if name != "shapes-llava":
            raise OSError(f"We couldn't connect to 'https://huggingface.co' to load {name}; offline")
        return mipruner.load(name, device="cpu")

    hub = ModelHub("llava-hf/llava-1.5-7b-hf", loader=loader)
    msg = hub.load_default()
    assert "Could not load 'llava-hf/llava-1.5-7b-hf'" in msg and "shapes-llava" in msg
    assert hub.default == "shapes-llava" and hub.loaded == ["shapes-llava"]
    engine, note = hub.get("someone/missing-model")
    assert engine.model_name == "shapes-llava" and "Could not load 'someone/missing-model'" in note
    assert "model hub cannot be reached" in note
    engine, note = hub.get("")
    assert note == "" and engine.model_name == "shapes-llava"


def test_in_llm_methods_side_by_side(logic, encoded):
    s = Settings(methods=("mi", "fastv", "dart"), budget=24, layer=2)
    views, summary = logic.view(encoded, s)
    assert [m["kept"] for m in summary["methods"]] == [24, 24, 24]
    assert views[1].selection.extras["layer"] == 2
    out = logic.generate(encoded, s, 4)
    assert out["methods"]["fastv"]["visual_tokens"] == 24 == out["methods"]["dart"]["visual_tokens"]
    assert encoded.n_layers == 3
    with pytest.raises(UserError, match="layer"):
        logic.view(encoded, Settings(methods=("fastv",), budget=24, layer=9))


def test_slider_benchmark_encodes_panels_as_the_app_does():
    from components.page.panels import IMAGE_FORMAT
    from mipruner.bench.slider import PANEL_FORMAT

    assert PANEL_FORMAT == IMAGE_FORMAT


def test_out_of_memory_is_reported_plainly(logic, encoded, monkeypatch):
    engine = logic.hub.get("shapes-llava")[0]

    def oom(*a, **kw):
        raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(engine, "generate", oom)
    monkeypatch.setattr(engine, "generate_many", oom)
    with pytest.raises(UserError, match="out of memory while generating: lower the budget"):
        logic.generate(encoded, Settings(methods=("mi",), budget=8), 4)
    monkeypatch.setattr(engine, "encode", oom)
    with pytest.raises(UserError, match="out of memory while encoding"):
        logic.encode(None, "shapes-llava", "image", EXAMPLE["path"], None, "what is new?")
