"""A batch of 32 unpruned rows at LLaVA-1.5's geometry (CLIP at 336 px, patch 14: 576 visual tokens per
image; a one-layer tower and a two-layer Llama, narrow) answers through the decoding engine without
materializing any (S, S) tensor, S = the rows' lengths summed (the packed mask held S^2 entries), and
its answers are the one-by-one answers: tokens equal at every step before a near-tie of the one-by-one
run (tie rule, batch_check.py), and each row's logits at those steps within TOL of its one-by-one logits
(a padded, masked forward runs other kernels than an unpadded one: float rounding only)."""
from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from mipruner.serve.batch import answer_items
from mipruner.models.llava.random_weights import build_random_llava

from ..no_grad import seeded_no_grad  # noqa: F401  (autouse: autograd off for this module)
from .batch_check import Scores, check_logits, compare_all, one_by_one
from .tiny_llava import scene

ROWS, NEW = 32, 3
# float32 logits of rows computed by different kernels (padded/masked vs one row): 2^-11 ~ 1000 eps
TOL = 1024 * torch.finfo(torch.float32).eps
PROMPTS = ["What is in the image?", "What colour is the square?", "Is there a cat?", "How many objects are there?"]


class LargestTensors(TorchDispatchMode):
    """Records the shape of every tensor an aten op returns."""

    def __init__(self):
        super().__init__()
        self.shapes: list[tuple[int, ...]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.shapes.append(tuple(t.shape))
        return out


@pytest.fixture(scope="module")
def llava15():
    a, _ = build_random_llava(image_size=336, patch=14, vision_layers=1, vision_width=64, llm_layers=2,
                              llm_width=128, llm_ffn=256, dtype=torch.float32, text_init=0.2)
    encs = [a.encode(scene(336, 336, square=(8 * (i % 8), 8 * (i // 8), 120 + 4 * i, 120), seed=i),
                     PROMPTS[i % len(PROMPTS)]) for i in range(ROWS)]
    return a, encs


def test_32_unpruned_rows_hold_no_square_mask_and_answer_as_one_by_one(llava15):
    a, encs = llava15
    assert all(e.n_visual == 576 for e in encs)
    rows = [(e, None) for e in encs]
    scores = Scores()
    with LargestTensors() as seen:
        got = answer_items(a, rows, max_new_tokens=NEW, logits_processor=[scores])
    lengths = [g.input_tokens for g in got]
    total = sum(lengths)
    assert len(set(lengths)) > 1 and total > 32 * 576
    square = [s for s in seen.shapes if sum(d >= total for d in s) >= 2]
    assert square == [], square[:3]
    assert max(torch.Size(s).numel() for s in seen.shapes) < total * total // 8
    ref = [one_by_one(a, e, [None], NEW)[0] for e in encs]
    done, steps = compare_all(got, ref)
    assert done >= 0.75 * steps, (done, steps)
    for i, (_, rec) in enumerate(ref):
        scale = float(rec.steps[0].abs().max())
        check_logits(_Row(scores, i), [(None, rec)], atol=TOL * max(scale, 1.0))


class _Row:
    """Row i of a batched Scores, as a one-row Scores for check_logits."""

    def __init__(self, scores: Scores, i: int):
        self.steps = [s[i:i + 1] for s in scores.steps]
