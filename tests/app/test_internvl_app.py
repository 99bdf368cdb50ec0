"""The app's handlers on a tiny InternVL checkpoint in a local folder, as a user runs it: an image
(tiles + thumbnail) and a video are encoded and every method's panels (mask, heatmap, pivots), the
answers, a click and the export render."""
from __future__ import annotations

import numpy as np
import pytest

import mipruner
from components.hub import SUGGESTED, ModelHub
from components.logic import AppLogic
from components.policy import ModelPolicy
from components.settings import Settings
from mipruner.media import write_video
from tests.models.tiny_internvl import save_tiny
from tests.models.tiny_llava import scene


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("iv_user")
    path = save_tiny(str(root / "tiny-internvl"))
    scene(120, 80, square=(30, 20, 60, 50)).save(root / "pic.png")
    frames = [scene(80, 60, square=(4 * i, 10, 4 * i + 14, 24), seed=i) for i in range(12)]
    video = write_video(frames, str(root / "clip.mp4"))
    hub = ModelHub("shapes-llava", device="cpu", policy=ModelPolicy(model_dirs=(str(root),)))
    hub.load_default()
    return AppLogic(hub, max_new_tokens=3), path, str(root / "pic.png"), video


def test_internvl_checkpoints_in_the_dropdown():
    assert {"OpenGVLab/InternVL3-1B-hf", "OpenGVLab/InternVL3-8B-hf"} <= set(SUGGESTED)


@pytest.mark.parametrize("kind", ["image", "video"])
def test_internvl_app_renders_every_panel(setup, kind):
    logic, path, image, video = setup
    st, msg = logic.encode(None, path, kind, image if kind == "image" else None, video if kind == "video" else None,
                           "What colour is the square?")
    assert "tiny-internvl" in msg and "instead" not in msg
    names = mipruner.list_pruners()
    for i in range(0, len(names), 3):
        views, summary = logic.view(st, Settings(methods=tuple(names[i:i + 3]), budget=0.25))
        for v in views:
            assert abs(v.kept - 0.25 * st.n_visual) <= 1 and len(v.selection.keep) <= v.kept
            w, h = v.mask.size
            assert np.asarray(v.heatmap).shape[:2] == (h, w)
            assert np.asarray(v.mask).std() > 0  # something is drawn
    if kind == "image":
        assert w > 2 * 120  # the tile canvas and the thumbnail side by side
    else:
        assert w > 7 * 80  # eight frames
    out = logic.generate(st, Settings(methods=("mi", "fastv"), budget=0.25), 3)
    assert out["reference"]["visual_tokens"] == st.n_visual
    assert logic.inspect(st, Settings(methods=("mi",), budget=0.25), w * 0.3, h * 0.3)["token"] is not None
    files = logic.export(st, Settings(methods=("mi",), budget=0.25), logic.new_export_dir())
    assert any(f.endswith("mi_mask.png") for f in files)
