"""Evaluation items from the synthetic scenes (`mipruner.shapes.scenes`), with the asked object's masks.

Use a seed never used in training (the default 1234 is held out by `mipruner.shapes.train`).
"""
from __future__ import annotations

from mipruner.shapes import questions as sq
from mipruner.shapes import scenes as sc

from .tasks import EvalItem


YESNO = ("presence", "appeared", "stayed", "absent")


def _to_eval(q: sq.QAItem, i: int, video: bool) -> EvalItem:
    frames = q.images
    if video:
        from mipruner.media import Video

        media = Video(frames=frames, indices=list(range(len(frames))), fps=4.0, total_frames=len(frames))
    else:
        media = frames[0]
    return EvalItem(id=f"{q.family}-{i}", media=media, question=q.question, answer=q.answer,
                    kind="yesno" if q.family in YESNO else "open", split=q.split or "all",
                    masks=q.masks if video else q.masks[:1])


def shapes_items(task: str, n: int = 60, seed: int = 1234) -> list[EvalItem]:
    """`n` items (per POPE split for shapes-pope) of task shapes-pope / shapes-open / shapes-video /
    shapes-events (clips whose answers are in some frames only: `mipruner.shapes.events`; split = family).

    POPE items are taken scene by scene (each scene's positives with its negatives), so the
    yes/no balance of each split is kept.
    """
    if task == "shapes-pope":
        out = []
        for split in sc.POPE_SPLITS:
            scenes, items = [], []
            while len(items) < n:
                scenes.append(sc.make_scene(seed, len(scenes)))
                items = sq.pope_items(scenes, split, seed)
            out += [_to_eval(q, i, False) for i, q in enumerate(items)]
        return out
    if task in ("shapes-open", "shapes-video"):
        video = task == "shapes-video"
        items: list[sq.QAItem] = []
        i = 0
        while len(items) < n:
            s = sc.make_clip(seed, i) if video else sc.make_scene(seed, i)
            items += sq.color_items(s) + sq.count_items(s)
            i += 1
        return [_to_eval(q, j, video) for j, q in enumerate(items[:n])]
    if task == "shapes-events":
        from mipruner.shapes.events import events_items

        return [_to_eval(q, j, True) for j, q in enumerate(events_items(seed, n))]
    raise ValueError(f"unknown synthetic task {task!r}; choose shapes-pope, shapes-open, shapes-video or shapes-events")
