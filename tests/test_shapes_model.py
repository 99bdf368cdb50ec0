"""The shipped shapes-llava model (assets/shapes-llava): loads offline, answers held-out questions.

The questions come from a scene seed the trainer never draws from (training uses seed 0), with
balanced answers, so the answer prior scores about 0.5 (presence), 0.17-0.25 (colour) and 0.25
(count). The shipped model does NOT reach the project's targets (>= 0.95 presence, >= 0.85 colour
and count): on these 60 questions per family it scores 0.72 / 0.83 / 0.85, on the natural held-out
distribution 0.61 / 0.79 / 0.76 (`python -m mipruner.train_shapes --eval assets/shapes-llava`).
The floors below sit under what it reliably achieves and well above the prior.
"""
import os
from collections import defaultdict

import numpy as np
import pytest
import torch

from mipruner import scenes as sc
from mipruner.models import resolve

PATH = resolve("shapes-llava")
HELD_OUT_SEED = 987_654  # never used by mipruner.train_shapes
# Minimum accuracy per family over the questions drawn below (measured 0.72 / 0.83 / 0.85).
ACCURACY = {"presence": 0.62, "color": 0.70, "count": 0.70}

pytestmark = pytest.mark.skipif(not os.path.exists(os.path.join(PATH, "config.json")),
                                reason="assets/shapes-llava is not built")


@pytest.fixture(scope="module")
def adapter():
    import mipruner

    torch.set_num_threads(min(2, torch.get_num_threads()))
    return mipruner.load("shapes-llava", device="cpu")


def _questions(n_per_family: int = 60) -> list[sc.QAItem]:
    """Held-out questions with balanced answers (yes/no half and half, counts 1-4 alike), drawn as
    the trainer draws them but from a seed it never uses, so the answer prior cannot pass."""
    from mipruner.train_shapes import sample_qa

    rng = np.random.default_rng(HELD_OUT_SEED)
    out: dict[str, list[sc.QAItem]] = defaultdict(list)
    index = 0
    while min(len(out[f]) for f in sc.FAMILIES) < n_per_family:
        item = sample_qa(rng, HELD_OUT_SEED, index)
        index += 1
        if len(out[item.family]) < n_per_family:
            out[item.family].append(item)
    return [it for f in sc.FAMILIES for it in out[f]]


def test_loads_offline_with_config_geometry(adapter):
    v = adapter.model.config.vision_config
    enc = adapter.encode(sc.make_scene(HELD_OUT_SEED, 0).pil()[0], "what color is the circle?")
    assert enc.n_visual == (v.image_size // v.patch_size) ** 2
    assert enc.geometry.grids == [(v.image_size // v.patch_size,) * 2]
    assert enc.scoring_tokens == ["what", "color", "is", "the", "circle", "?"]


def test_answers_held_out_questions(adapter):
    right = defaultdict(list)
    for item in _questions():
        enc = adapter.encode(item.images[0], item.question)
        answer = adapter.generate(enc, max_new_tokens=3).text.strip()
        right[item.family].append(answer == item.answer)
    acc = {f: float(np.mean(v)) for f, v in right.items()}
    for family, floor in ACCURACY.items():
        assert acc[family] >= floor, (family, acc)


def test_aligned_projection_keeps_the_asked_object(adapter):
    """MI-Pruner's premise on this model: the question's words point at the asked object."""
    import mipruner

    g = adapter.model.config.vision_config.image_size // adapter.model.config.vision_config.patch_size
    recall_mi, recall_rand = [], []
    rng = np.random.default_rng(1)
    for item in [it for it in _questions(10) if it.masks[0].any()]:
        enc = adapter.encode(item.images[0], item.question)
        target = np.nonzero(sc.patch_coverage(item.masks[0], g, g) >= sc.PATCH_MIN_COVER)[0]
        if len(target) == 0:
            continue
        keep = mipruner.prune("mi", visual=enc.visual, text=enc.scoring_text, budget=16, lam=1.0).keep.numpy()
        recall_mi.append(np.isin(target, keep).mean())
        recall_rand.append(np.isin(target, rng.choice(g * g, 16, replace=False)).mean())
    assert np.mean(recall_mi) > 0.6 and np.mean(recall_mi) > 3 * np.mean(recall_rand)
