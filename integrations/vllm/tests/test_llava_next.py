"""LLaVA-NeXT's anyres layout in the plug-in (mipruner_vllm/llava_next.py): over images of many sizes and aspects
(padded rows or columns cut by the unpad, or none), the N that vLLM's front end states before scheduling is the N
its model returns and mipruner's own adapter encodes, and the worker's (view, row, col) grid and frame index are
mipruner's geometry's. The anchor tests (test_anchor.py) check the tokens on two of these sizes."""
from __future__ import annotations

import pytest
import torch

import mipruner
from images import image
from mipruner_vllm.llava_next import anyres_grid
from mipruner_vllm import select as worker

QUESTION = "what is in the image ?"
# (width, height, seed): square (columns cut), tall, wide, very wide (rows cut), very tall, and uneven ones
SIZES = [(56, 56, 0), (40, 90, 2), (90, 40, 1), (120, 20, 3), (20, 120, 4), (100, 57, 5), (33, 71, 6), (170, 60, 7)]


def test_grid_and_frames_are_mipruners_geometry(models):
    _, adapter = models["llava_next"]
    newlines = set()
    for w, h, seed in SIZES:
        enc = mipruner.encode_for(adapter, image(w, h, seed), QUESTION, ["pool"])
        grid = anyres_grid(adapter.model.config, (h, w), enc.n_visual)
        assert torch.equal(grid, enc.grid.cpu()), (w, h)
        assert torch.equal(torch.where(grid[:, 0] < 0, -1, 0), enc.frame_index.cpu()), (w, h)
        newlines.add(int((grid[:, 0] < 0).sum()))
    assert len(newlines) > 2  # the sizes give canvases of different heights
    with pytest.raises(RuntimeError, match="not a 4x4 base view"):
        anyres_grid(adapter.model.config, (56, 56), 17)


@pytest.mark.parametrize("engine", ["llava_next"], indirect=True)
def test_every_size_states_n_before_scheduling(engine):
    from test_anchor import run

    _, llm, adapter, _ = engine
    for w, h, seed in SIZES:
        full, one = run(llm, adapter, (w, h, seed), [{}, {"mipruner_method": "random", "mipruner_budget": 1}])
        n = mipruner.encode_for(adapter, image(w, h, seed), QUESTION).n_visual
        assert [r["n"] for r in worker.RECORD] == [n], (w, h)  # vLLM's model returned mipruner's N tokens
        assert len(full.prompt_token_ids) - len(one.prompt_token_ids) == n - 1, (w, h)  # and the front end stated it
