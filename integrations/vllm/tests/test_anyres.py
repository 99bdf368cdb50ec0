"""The anyres layouts in the plug-in (mipruner_vllm/llava_next.py, llava_onevision.py): over images of many sizes
and aspects (padded rows or columns cut by the unpad, or none; OneVision's canvas shrunk past 9 tiles' worth, or
not), the N that vLLM's front end states before scheduling is the N its model returns and mipruner's own adapter
encodes, and the worker's (view, row, col) grid and frame index are mipruner's geometry's (videos too). The anchor
tests (test_anchor.py) check the tokens on two of these sizes per family."""
from __future__ import annotations

import types

import pytest
import torch

import mipruner
from images import FPS, frames, image
from mipruner.media import Video
from mipruner_vllm import select as worker
from mipruner_vllm.llava_next import anyres_grid
from mipruner_vllm.llava_onevision import image_grid, video_grid

QUESTION = "what is in the image ?"
# (width, height, seed): square, tall, wide, very wide or tall (rows or columns cut), uneven; OneVision's also
# large ones, whose canvas it shrinks
SIZES = {"llava_next": [(56, 56, 0), (40, 90, 2), (90, 40, 1), (120, 20, 3), (20, 120, 4), (100, 57, 5), (33, 71, 6),
                        (170, 60, 7)],
         "llava_onevision": [(64, 64, 0), (40, 90, 2), (150, 60, 1), (300, 200, 3), (500, 120, 4), (90, 400, 5),
                             (100, 57, 6)]}


def onevision_grid(adapter, img, n):
    """`image_grid` on an object with the checkpoint's config and vLLM's own `_merge_image_patch_embeddings`."""
    from vllm.model_executor.models.llava_onevision import LlavaOnevisionForConditionalGeneration as Stock

    model = types.SimpleNamespace(config=adapter.model.config)
    model._merge_image_patch_embeddings = types.MethodType(Stock._merge_image_patch_embeddings, model)
    views = adapter.image_processor(img, return_tensors="pt")["pixel_values"].shape[1]
    return image_grid(model, (img.size[1], img.size[0]), views, n)


@pytest.mark.parametrize("fam", list(SIZES))
def test_grid_and_frames_are_mipruners_geometry(models, fam):
    _, adapter = models[fam]
    rows = set()
    for w, h, seed in SIZES[fam]:
        img = image(w, h, seed)
        enc = mipruner.encode_for(adapter, img, QUESTION, ["pool"])
        grid = (anyres_grid(adapter.model.config, (h, w), enc.n_visual) if fam == "llava_next"
                else onevision_grid(adapter, img, enc.n_visual))
        assert torch.equal(grid, enc.grid.cpu()), (w, h)
        assert torch.equal(torch.where(grid[:, 0] < 0, -1, 0), enc.frame_index.cpu()), (w, h)
        rows.add(int((grid[:, 0] < 0).sum()))
    assert len(rows) > 2  # canvases of different heights
    with pytest.raises(RuntimeError, match="not a 4x4 base view"):
        anyres_grid(adapter.model.config, (56, 56), 17) if fam == "llava_next" else onevision_grid(adapter,
                                                                                                  image(64, 64, 0), 17)


def test_video_grid_is_mipruners_geometry(models):
    _, adapter = models["llava_onevision"]
    for count in (1, 4, 6):
        fs = frames(count, 64, 64, 0)
        enc = mipruner.encode_for(adapter, Video(fs, list(range(count)), FPS, count), QUESTION, ["pool"])
        grid = video_grid(count, enc.n_visual)
        assert torch.equal(grid, enc.grid.cpu()), count
        assert torch.equal(grid[:, 0], enc.frame_index.cpu()), count


@pytest.mark.parametrize("engine", list(SIZES), indirect=True)
def test_every_size_states_n_before_scheduling(engine):
    from test_anchor import run

    fam, llm, adapter, _ = engine
    for w, h, seed in SIZES[fam]:
        full, one = run(llm, adapter, (w, h, seed), [{}, {"mipruner_method": "random", "mipruner_budget": 1}])
        n = mipruner.encode_for(adapter, image(w, h, seed), QUESTION).n_visual
        assert [r["n"] for r in worker.RECORD] == [n], (w, h)  # vLLM's model returned mipruner's N tokens
        assert len(full.prompt_token_ids) - len(one.prompt_token_ids) == n - 1, (w, h)  # and the front end stated it
