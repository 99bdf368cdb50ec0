"""Batched encodings (`mipruner.serve.batch.encode_items`, `LlavaAdapter.encode_batch`, Qwen's `encode_batch`):
several one-image items through ONE vision-tower call give the one-by-one encodings (visual tokens, attention, keys,
[CLS] rows up to float rounding of the batched tower; ids, text and geometry exactly) and answers;
items the family cannot batch (a video, several images) are encoded one by one in the same call;
an evaluation run calls the tower ceil(n / batch) times (a forward hook counts the calls)."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from PIL import Image

import mipruner
from mipruner.serve.batch import encode_items
from mipruner.eval.runner import evaluate
from mipruner.eval.tasks import EvalItem
from mipruner.media import Video

from ..no_grad import no_grad  # noqa: F401  (autouse: autograd off for this module)
from .batch_check import compare, one_by_one
from .tiny_llava import save_tiny, scene

PROMPTS = ["What colour is the square?", "Is there a square?", "Where is the square?"]


@pytest.fixture(scope="module")
def llava(tmp_path_factory):
    return mipruner.load(save_tiny("llava", str(tmp_path_factory.mktemp("encode_batch") / "llava")), device="cpu")


class TowerCalls:
    """Counts the passes through the adapter's vision tower: the calls of its patch embedding, which every pass
    makes once, whether through the tower's forward or only up to the projector's block (`short_tower`)."""

    def __init__(self, adapter):
        tower = adapter.model.model.vision_tower
        self.tower, self.n = getattr(tower, "embeddings", tower), 0

    def __enter__(self):
        self.handle = self.tower.register_forward_hook(lambda *a: setattr(self, "n", self.n + 1))
        return self

    def __exit__(self, *exc):
        self.handle.remove()


def _same(a, b):
    assert torch.equal(a.state.input_ids, b.state.input_ids) and a.text_tokens == b.text_tokens
    assert torch.equal(a.text, b.text) and torch.equal(a.text_mask, b.text_mask)
    for name in ("frame", "row", "col", "box"):
        assert torch.equal(getattr(a.geometry, name), getattr(b.geometry, name))
    for name in ("visual", "attention", "keys", "cls"):
        x, y = getattr(a, name), getattr(b, name)
        assert (x is None) == (y is None)
        if x is not None:
            torch.testing.assert_close(x, y, atol=1e-5, rtol=1e-5)


def test_batched_encodings_equal_one_by_one(llava):
    images = [scene(112, 56, square=(70, 14, 84, 28)), scene(60, 80, square=(10, 10, 30, 30)),
              scene(96, 96, square=(40, 50, 60, 70))]
    frames = [scene(80, 60, square=(4 * i, 10, 4 * i + 14, 24), seed=i) for i in range(4)]
    video = Video(frames=frames, indices=[0, 2, 4, 6], fps=8.0, total_frames=8)
    items = [(images[0], PROMPTS[0]), (video, PROMPTS[1]), (images[1], PROMPTS[1]), ([images[2]], PROMPTS[2])]
    with TowerCalls(llava) as calls:
        got = encode_items(llava, items, batch=4, need_attention=True)
    assert calls.n == 2  # the three single images in one call, the video alone
    alone = [llava.encode(m, p, need_attention=True) for m, p in items]
    for g, a in zip(got, alone):
        _same(g, a)
    for g, a in zip(got, alone):  # and the answers are the one-by-one answers
        keep = torch.arange(0, a.n_visual, 3)
        (ref, rec), = one_by_one(llava, a, [keep], 4)
        assert compare(llava.generate(g, keep, max_new_tokens=4).token_ids, ref.token_ids, rec.margins) >= 1


def test_an_eval_run_calls_the_tower_once_per_group(llava):
    rng = np.random.default_rng(0)
    items = [EvalItem(id=str(i), media=Image.fromarray(rng.integers(0, 255, (40 + i, 50, 3), dtype=np.uint8)),
                      question="Is there a square?", answer="yes", kind="yesno") for i in range(5)]
    for batch in (2, 1):
        with TowerCalls(llava) as calls:
            rows = evaluate(llava, items, ["none", "mi"], [4], {}, "t", max_new_tokens=2, encode_batch=batch)
        assert calls.n == math.ceil(len(items) / batch)
        if batch == 2:
            batched = rows
    assert [r["acc"] for r in batched] == [r["acc"] for r in rows]


QWEN = [f for f, fam in mipruner.models.FAMILIES.items() if fam.folder == "qwen"]


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    from . import tiny_qwen

    root = tmp_path_factory.mktemp("encode_batch_qwen")
    return {k: mipruner.load(tiny_qwen.build(k, str(root / k))) for k in QWEN}


@pytest.mark.parametrize("kind", QWEN)
def test_qwen_batches_its_single_images(qwen, kind):
    """Qwen2-VL / 2.5-VL / 3-VL: single images of different native sizes share ONE tower call (a video is
    encoded alone) and give the one-by-one encodings (Qwen3-VL's deepstack rows too); an encoding that
    records the tower's attention is one call an item."""
    from .test_qwen_family import video

    a = qwen[kind]
    images = [scene(112, 56, square=(70, 14, 84, 28)), scene(60, 80, square=(10, 10, 30, 30)),
              scene(96, 96, square=(40, 50, 60, 70))]
    items = [(images[0], PROMPTS[0]), (video(), PROMPTS[1]), (images[1], PROMPTS[1]), (images[2], PROMPTS[2])]
    tower = a.model.model.visual
    calls = []
    handle = tower.register_forward_hook(lambda *_: calls.append(1))
    try:
        got = encode_items(a, items, batch=4)
        batched_calls = len(calls)
        encode_items(a, items[:1] + items[2:], batch=4, need_attention=True)
    finally:
        handle.remove()
    assert batched_calls == 2 and len(calls) == 2 + 3  # three images in one call, the video alone
    alone = [a.encode(m, p) for m, p in items]
    for g, x in zip(got, alone):
        assert torch.equal(g.state.input_ids, x.state.input_ids) and g.text_tokens == x.text_tokens
        assert torch.equal(g.geometry.box, x.geometry.box) and torch.equal(g.state.positions, x.state.positions)
        torch.testing.assert_close(g.visual, x.visual, atol=1e-5, rtol=1e-5)
        for gd, xd in zip(getattr(g.state, "deepstack", None) or [], getattr(x.state, "deepstack", None) or []):
            torch.testing.assert_close(gd, xd, atol=1e-5, rtol=1e-5)


def test_a_qwen_eval_run_calls_the_tower_once_per_group(qwen):
    """`python -m mipruner.eval`'s runner on Qwen2-VL: ceil(n / batch) tower calls, the same accuracy."""
    a = qwen["qwen2_vl"]
    rng = np.random.default_rng(0)
    items = [EvalItem(id=str(i), media=Image.fromarray(rng.integers(0, 255, (40 + 4 * i, 50, 3), dtype=np.uint8)),
                      question="Is there a square?", answer="yes", kind="yesno") for i in range(5)]
    runs = {}
    for batch in (2, 1):
        calls = []
        handle = a.model.model.visual.register_forward_hook(lambda *_: calls.append(1))
        try:
            runs[batch] = evaluate(a, items, ["none", "mi"], [4], {}, "t", max_new_tokens=2, encode_batch=batch)
        finally:
            handle.remove()
        assert len(calls) == math.ceil(len(items) / batch)
    assert [r["acc"] for r in runs[2]] == [r["acc"] for r in runs[1]]
