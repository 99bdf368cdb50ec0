"""Questions about the synthetic scenes, all with one-word answers: presence ("is there a red
circle?" -> yes/no, with POPE's random / popular / adversarial negatives), colour of a unique shape
("what color is the circle?" -> red) and count of a shape ("how many squares are there?" -> two).
Each `QAItem` carries the asked objects' masks, per frame, for query recall."""
from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
from PIL import Image

from .scenes import CATEGORIES, NUMBERS, PLURALS, POPE_SPLITS, Scene, category_name, make_clip, make_scene


@dataclass
class QAItem:
    """One question about a scene or clip, its one-word answer and the asked objects' masks.

    masks: per frame, (H, W) bool union of the objects the question is about (all False for an
    absent object). split: the POPE rule for presence negatives and their paired positives
    ("random" / "popular" / "adversarial"), "" otherwise.
    """

    scene: Scene = field(repr=False)
    question: str
    answer: str
    family: str
    masks: list[np.ndarray] = field(repr=False)
    split: str = ""
    target: str = ""  # the asked category or shape

    @property
    def images(self) -> list[Image.Image]:
        return self.scene.pil()


def article(word: str) -> str:
    return "an" if word[0] in "aeiou" else "a"


def presence_question(color: str, shape: str) -> str:
    return f"is there {article(color)} {color} {shape}?"


def color_question(shape: str) -> str:
    return f"what color is the {shape}?"


def count_question(shape: str) -> str:
    return f"how many {PLURALS[shape]} are there?"


def presence_item(scene: Scene, color: str, shape: str, split: str = "") -> QAItem:
    present = category_name(color, shape) in scene.categories
    return QAItem(scene, presence_question(color, shape), "yes" if present else "no", "presence",
                  scene.masks_where(color, shape), split, category_name(color, shape))


def color_items(scene: Scene) -> list[QAItem]:
    """One colour question per shape that occurs exactly once in the scene."""
    counts = Counter(o.shape for o in scene.objects)
    return [QAItem(scene, color_question(o.shape), o.color, "color", scene.masks_where(shape=o.shape),
                   target=o.shape) for o in scene.objects if counts[o.shape] == 1]


def count_items(scene: Scene) -> list[QAItem]:
    """One count question per shape present in the scene (answers one..four)."""
    counts = Counter(o.shape for o in scene.objects)
    return [QAItem(scene, count_question(s), NUMBERS[n], "count", scene.masks_where(shape=s), target=s)
            for s, n in sorted(counts.items())]


def category_stats(scenes: list[Scene]) -> tuple[Counter, Counter]:
    """Data-set statistics for POPE: category frequency, and co-occurrence of category pairs."""
    freq: Counter = Counter()
    co: Counter = Counter()
    for s in scenes:
        cats = sorted(s.categories)
        freq.update(cats)
        co.update(itertools.permutations(cats, 2))
    return freq, co


def pope_negatives(scene: Scene, split: str, k: int, rng: np.random.Generator,
                   stats: tuple[Counter, Counter]) -> list[str]:
    """k absent categories by POPE's rule `split` (see module docstring); ties broken by name."""
    if split not in POPE_SPLITS:
        raise ValueError(f"split must be one of {POPE_SPLITS}, got {split!r}")
    present = scene.categories
    absent = [category_name(c, s) for c, s in CATEGORIES if category_name(c, s) not in present]
    freq, co = stats
    if split == "random":
        return [absent[i] for i in rng.choice(len(absent), size=min(k, len(absent)), replace=False)]
    if split == "popular":
        key = {a: freq[a] for a in absent}
    else:
        key = {a: sum(co[(p, a)] for p in present) for a in absent}
    return sorted(absent, key=lambda a: (-key[a], a))[:k]


def pope_items(scenes: list[Scene], split: str, seed: int = 0) -> list[QAItem]:
    """POPE-style presence questions: per scene every present category (yes) and as many
    absent ones (no) chosen by `split`, with frequencies/co-occurrences taken over `scenes`."""
    stats = category_stats(scenes)
    rng = np.random.default_rng([seed, POPE_SPLITS.index(split), 2])
    items = []
    for scene in scenes:
        present = sorted(scene.categories)
        negatives = pope_negatives(scene, split, len(present), rng, stats)
        for cat in present + negatives:
            items.append(presence_item(scene, *cat.split(" "), split=split))
    return items


def qa_items(seed: int, n_scenes: int, clips: bool = False, size: int = 112,
             pope_split: str | None = None) -> list[QAItem]:
    """Every question of the families about scenes (or clips) 0..n_scenes-1 of data set `seed`.

    Presence questions follow POPE's `pope_split` rule, or all three splits when None.
    """
    make = make_clip if clips else make_scene
    scenes = [make(seed, i, size=size) for i in range(n_scenes)]
    items: list[QAItem] = []
    for split in (POPE_SPLITS if pope_split is None else (pope_split,)):
        items += pope_items(scenes, split, seed)
    for s in scenes:
        items += color_items(s) + count_items(s)
    return items


__all__ = ["QAItem", "category_stats", "color_items", "count_items", "pope_items", "pope_negatives", "presence_item",
           "qa_items"]
