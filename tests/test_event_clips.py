"""The video set that needs time (`mipruner.shapes.events`, task `shapes-events`): answers live in some frames only."""
from collections import Counter

import numpy as np
import pytest

from mipruner.shapes import events as ev
from mipruner.shapes.scenes import NUMBERS


@pytest.mark.parametrize("index", range(12))
def test_the_event_object_appears_late_and_everything_else_stands_still(index):
    scene, start = ev.make_event_clip(1234, index)
    t = len(scene.frames)
    assert t // 2 <= start <= t - 1
    event = scene.tracks[-1]
    assert all(not event[f].mask.any() for f in range(start))  # absent before start
    assert all(event[f].mask.any() for f in range(start, t))   # present from start on
    for f in range(1, t):  # still frames repeat exactly: the redundancy along time
        same = np.array_equal(scene.frames[f], scene.frames[f - 1])
        assert same == (f != start), (f, start)
    drawn = scene.frames[start]
    assert (drawn[event[start].mask] == np.array(event[start].rgb, dtype=np.uint8)).all()
    for track in scene.tracks[:-1]:  # still objects: one mask in every frame
        assert all(np.array_equal(o.mask, track[0].mask) and o.mask.any() for o in track)


def test_same_seed_same_clip_and_questions():
    a, b = ev.events_items(7, 20), ev.events_items(7, 20)
    assert [(q.question, q.answer, q.family) for q in a] == [(q.question, q.answer, q.family) for q in b]
    assert all(np.array_equal(x, y) for qa, qb in zip(a, b) for x, y in zip(qa.images[0].getdata(), qb.images[0].getdata()))
    assert ev.make_event_clip(7, 0)[1] != ev.make_event_clip(7, 1)[1] or \
        not np.array_equal(ev.make_event_clip(7, 0)[0].frames[-1], ev.make_event_clip(7, 1)[0].frames[-1])


def test_answers_follow_the_clip():
    for i in range(10):
        scene, start = ev.make_event_clip(99, i)
        event = scene.tracks[-1][-1]
        shapes = Counter(t[-1].shape for t in scene.tracks)
        items = {q.family: q for q in ev.event_items(scene, start, np.random.default_rng(i))}
        assert items["appeared"].answer == "yes" and event.color in items["appeared"].question
        assert items["absent"].answer == "no" and items["absent"].target not in scene.categories
        assert items["stayed"].target in {t[0].category for t in scene.tracks[:-1]}
        assert items["late count"].answer == NUMBERS[shapes[event.shape]]
        if shapes[event.shape] == 1:
            assert items["late color"].answer == event.color
        else:
            assert "late color" not in items
        # the event's masks: empty before it appears, so query recall counts it where it is
        assert [m.any() for m in items["appeared"].masks] == [f >= start for f in range(len(scene.frames))]


def test_every_family_occurs_and_n_is_exact():
    items = ev.events_items(1234, 60)
    assert len(items) == 60
    assert set(Counter(q.family for q in items)) == set(ev.FAMILIES)


def test_bad_clip_sizes_are_refused():
    with pytest.raises(ValueError, match="at least 2 frames"):
        ev.make_event_clip(1, 0, n_frames=1)
    with pytest.raises(ValueError, match="at least 2 objects"):
        ev.make_event_clip(1, 0, n_objects=1)


def test_task_and_sweep_set():
    from mipruner.eval.shapes import shapes_items
    from mipruner.eval.sweep.sets import generated_set
    from mipruner.media import Video

    items = shapes_items("shapes-events", n=10)
    assert len(items) == 10 and all(isinstance(it.media, Video) and len(it.media.frames) == 8 for it in items)
    assert {it.kind for it in items if it.split in ("appeared", "stayed", "absent")} == {"yesno"}
    assert {it.kind for it in items if it.split.startswith("late")} == {"open"}
    assert all(len(it.masks) == 8 for it in items)
    assert [it.question for it in generated_set("events", n=6, seed=1234)] == [it.question for it in items[:6]]
