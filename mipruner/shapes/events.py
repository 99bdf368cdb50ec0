"""Clips whose answers live in some frames only: the video set that needs time (`shapes-events`).

In `make_clip` every object is in every frame and moves, so any frame answers any question and a
method that keeps one frame's tokens loses nothing. Here all objects stand still except one, the
*event* object, which appears at frame `start` (in the second half of the clip) and stays. So:
- the frames before `start` are exact repeats of frame 0 (the temporal redundancy a video method removes);
- a question about the event object is answered only by frames `start..T-1` (by the last frame when
  `start` is T-1): "what appeared in the last frames?" asked in the embedded model's words, which know
  colours, shapes and counts but not time ("is there a red circle?", "what color is the star?",
  "how many stars are there?" with the star appearing late).

Families (`QAItem.family`, the eval's split): `appeared` (presence of the event object: yes),
`stayed` (presence of a still object: yes), `absent` (presence of an absent category: no), `late color`
(colour of the event shape, when the clip has one of that shape), `late count` (count of the event
shape, the late one included). Masks are per frame, so query recall counts the event object only
in the frames that show it.
"""
from __future__ import annotations

from collections import Counter

import numpy as np

from .questions import QAItem, color_question, count_question, presence_question
from .scenes import (CATEGORIES, NUMBERS, Scene, SceneObject, _background, _layout, _pick_categories, _render,
                     category_name)

FAMILIES = ("appeared", "stayed", "absent", "late color", "late count")


def make_event_clip(seed: int, index: int, size: int = 112, n_frames: int = 8,
                    n_objects: int | None = None) -> tuple[Scene, int]:
    """Clip `index` of data set `seed` and the frame its event object appears in.

    2-4 objects (`n_objects`), all still; the last one (the event, of a category no still object has) is
    drawn from frame `start` on, with `start` uniform in [n_frames // 2, n_frames - 1]. Before `start` its
    track holds empty masks.
    """
    if n_frames < 2:
        raise ValueError(f"an event clip needs at least 2 frames, got {n_frames}")
    rng = np.random.default_rng([seed, index, 3])
    background, kind = _background(rng, size)
    n = int(rng.integers(2, 5)) if n_objects is None else n_objects
    if n < 2:
        raise ValueError(f"an event clip needs at least 2 objects (still ones and the event), got {n}")
    picked = _pick_categories(rng, n)
    while picked[-1] in picked[:-1]:  # the event's category shows nowhere before it appears
        picked[-1] = CATEGORIES[int(rng.integers(len(CATEGORIES)))]
    cats, radii, centres, rgbs = _layout(rng, size, n, picked)
    start = int(rng.integers(n_frames // 2, n_frames))
    objs = [(c, s, rgb, x, y, r) for (c, s), rgb, (x, y), r in zip(cats, rgbs, centres, radii)]
    frames, tracks = [], [[] for _ in objs]
    before = after = None
    for f in range(n_frames):
        if f < start:
            if before is None:
                before = _render(background, objs[:-1], size)
            img, drawn = before
            c, s, rgb, x, y, r = objs[-1]
            drawn = drawn + [SceneObject(c, s, rgb, (float(x), float(y)), float(r),
                                         np.zeros((size, size), dtype=bool))]
        else:
            if after is None:
                after = _render(background, objs, size)
            img, drawn = after
        frames.append(img)
        for track, o in zip(tracks, drawn):
            track.append(o)
    return Scene(seed, index, frames, tracks, kind), start


def event_items(scene: Scene, start: int, rng: np.random.Generator) -> list[QAItem]:
    """The questions of `FAMILIES` about one event clip (see the module docstring)."""
    event = scene.tracks[-1][-1]
    still = [t[0] for t in scene.tracks[:-1]]
    present = {o.category for o in still} | {event.category}
    absent = [category_name(c, s) for c, s in CATEGORIES if category_name(c, s) not in present]
    gone = absent[int(rng.integers(len(absent)))]
    stay = still[int(rng.integers(len(still)))]
    counts = Counter(o.shape for o in still + [event])
    items = [
        QAItem(scene, presence_question(event.color, event.shape), "yes", "appeared",
               scene.masks_where(event.color, event.shape), split="appeared", target=event.category),
        QAItem(scene, presence_question(stay.color, stay.shape), "yes", "stayed",
               scene.masks_where(stay.color, stay.shape), split="stayed", target=stay.category),
        QAItem(scene, presence_question(*gone.split(" ")), "no", "absent",
               [np.zeros_like(m) for m in scene.masks_where()], split="absent", target=gone),
    ]
    if counts[event.shape] == 1:
        items.append(QAItem(scene, color_question(event.shape), event.color, "late color",
                            scene.masks_where(shape=event.shape), split="late color", target=event.shape))
    items.append(QAItem(scene, count_question(event.shape), NUMBERS[counts[event.shape]], "late count",
                        scene.masks_where(shape=event.shape), split="late count", target=event.shape))
    return items


def events_items(seed: int, n: int, size: int = 112, n_frames: int = 8) -> list[QAItem]:
    """The first `n` questions over event clips 0, 1, ... of data set `seed` (all families of a clip in turn)."""
    items: list[QAItem] = []
    i = 0
    while len(items) < n:
        scene, start = make_event_clip(seed, i, size=size, n_frames=n_frames)
        items += event_items(scene, start, np.random.default_rng([seed, i, 4]))
        i += 1
    return items[:n]


__all__ = ["FAMILIES", "event_items", "events_items", "make_event_clip"]
