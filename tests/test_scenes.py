"""The synthetic scene generator: determinism, masks vs pixels, POPE negative rules, answers."""
from collections import Counter

import numpy as np
import pytest

from mipruner.shapes import questions as sq
from mipruner.shapes import scenes as sc


def test_same_seed_same_pixels_and_questions():
    a, b = sc.make_scene(3, 7), sc.make_scene(3, 7)
    assert np.array_equal(a.image, b.image)
    assert [o.category for o in a.objects] == [o.category for o in b.objects]
    qa, qb = sq.qa_items(5, 12), sq.qa_items(5, 12)
    assert [(q.question, q.answer, q.split) for q in qa] == [(q.question, q.answer, q.split) for q in qb]
    ca, cb = sc.make_clip(3, 7), sc.make_clip(3, 7)
    assert all(np.array_equal(x, y) for x, y in zip(ca.frames, cb.frames))


def test_different_seeds_or_indices_differ():
    assert not np.array_equal(sc.make_scene(0, 0).image, sc.make_scene(1, 0).image)
    assert not np.array_equal(sc.make_scene(0, 0).image, sc.make_scene(0, 1).image)
    assert [(q.question, q.answer) for q in sq.qa_items(0, 12)] != [(q.question, q.answer) for q in sq.qa_items(1, 12)]


@pytest.mark.parametrize("clip", [False, True])
def test_masks_are_the_drawn_pixels(clip):
    for i in range(10):
        scene = (sc.make_clip if clip else sc.make_scene)(11, i)
        assert 1 <= len(scene.objects) <= sc.MAX_OBJECTS
        assert len(scene.frames) == (8 if clip else 1)
        for f, frame in enumerate(scene.frames):
            union = np.zeros(frame.shape[:2], dtype=bool)
            for track in scene.tracks:
                o = track[f]
                assert o.mask.dtype == bool and o.mask.shape == frame.shape[:2]
                assert not (union & o.mask).any(), "visible masks must not overlap"
                union |= o.mask
                if o.mask.any():
                    assert (frame[o.mask] == np.array(o.rgb, dtype=np.uint8)).all()
                    # the drawn colour is the named one, within the jitter
                    assert np.abs(np.array(o.rgb) - np.array(sc.COLORS[o.color])).max() <= sc.COLOR_JITTER
            if not clip:  # still objects are whole and apart: every object is visible
                assert all(o.mask.sum() > 50 for o in scene.objects)


def test_shapes_differ_in_outline():
    masks = {s: sc.shape_mask(s, 50, 50, 20, 112) for s in sc.SHAPES}
    areas = {s: int(m.sum()) for s, m in masks.items()}
    assert areas["circle"] > areas["triangle"] and areas["square"] > areas["star"]
    assert len({m.tobytes() for m in masks.values()}) == len(sc.SHAPES)


def test_answers_follow_the_scene():
    for i in range(30):
        scene = sc.make_scene(21, i)
        shapes = Counter(o.shape for o in scene.objects)
        for item in sq.color_items(scene):
            (obj,) = [o for o in scene.objects if o.shape == item.target]
            assert item.answer == obj.color and item.question == f"what color is the {obj.shape}?"
            assert np.array_equal(item.masks[0], obj.mask)
        for item in sq.count_items(scene):
            assert item.answer == sc.NUMBERS[shapes[item.target]]
            assert item.masks[0].sum() == sum(o.mask.sum() for o in scene.objects if o.shape == item.target)
        for color, shape in sc.CATEGORIES:
            item = sq.presence_item(scene, color, shape)
            present = any(o.color == color and o.shape == shape for o in scene.objects)
            assert item.answer == ("yes" if present else "no")
            assert item.masks[0].any() == present


def test_pope_negative_rules():
    scenes = [sc.make_scene(4, i) for i in range(80)]
    freq, co = sq.category_stats(scenes)
    assert len(set(freq.values())) > 3, "category frequencies must differ for 'popular' to mean anything"
    for split in sc.POPE_SPLITS:
        items = sq.pope_items(scenes, split, seed=4)
        assert Counter(it.answer for it in items)["yes"] == Counter(it.answer for it in items)["no"]
        assert all(it.split == split and it.family == "presence" for it in items)
    rng = np.random.default_rng(0)
    for scene in scenes[:20]:
        present = scene.categories
        absent = [sc.category_name(c, s) for c, s in sc.CATEGORIES if sc.category_name(c, s) not in present]
        for split in sc.POPE_SPLITS:
            neg = sq.pope_negatives(scene, split, 3, rng, (freq, co))
            assert len(neg) == 3 and len(set(neg)) == 3 and not set(neg) & present
        popular = sq.pope_negatives(scene, "popular", 3, rng, (freq, co))
        worst_kept = min(freq[a] for a in popular)
        assert all(freq[a] <= worst_kept for a in absent if a not in popular)
        adversarial = sq.pope_negatives(scene, "adversarial", 3, rng, (freq, co))
        score = {a: sum(co[(p, a)] for p in present) for a in absent}
        assert all(score[a] <= min(score[b] for b in adversarial) for a in absent if a not in adversarial)
    # the rules pick different objects: adversarial negatives co-occur more than random ones
    adv, rnd = [], []
    for scene in scenes:
        for split, out in (("adversarial", adv), ("random", rnd)):
            out += [sum(co[(p, a)] for p in scene.categories)
                    for a in sq.pope_negatives(scene, split, 2, rng, (freq, co))]
    assert np.mean(adv) > 2 * np.mean(rnd)


def test_invalid_split_raises():
    with pytest.raises(ValueError, match="split"):
        sq.pope_negatives(sc.make_scene(0, 0), "hard", 1, np.random.default_rng(0), (Counter(), Counter()))


def test_patch_coverage():
    mask = np.zeros((112, 112), dtype=bool)
    mask[8:16, 0:4] = True
    cov = sc.patch_coverage(mask, 14, 14)
    assert cov.shape == (196,) and cov[14] == 0.5 and cov.sum() == 0.5
    odd = sc.patch_coverage(mask[:, :110], 3, 5)  # cells of unequal size still sum to the area
    assert odd.shape == (15,) and odd.max() > 0
