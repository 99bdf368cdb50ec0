"""Evaluation items: the public POPE question files, and (when shipped) the synthetic scenes.

An item is one question about one image (or clip) with its gold answer; synthetic items also
carry the asked object's pixel masks, from which query recall is measured.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

POPE_SPLITS = ("random", "popular", "adversarial")


@dataclass
class EvalItem:
    id: str
    media: Any  # a PIL image, a list of images, or a path the adapter can read
    question: str
    answer: str
    kind: str  # "yesno" or "open"
    split: str = "all"
    masks: list[np.ndarray] | None = field(default=None, repr=False)  # per frame (H, W) bool


def _split_of(path: str) -> str:
    name = os.path.basename(path).lower()
    return next((s for s in POPE_SPLITS if s in name), "all")


def read_pope(files: list[str], images: str, n: int | None = None) -> list[EvalItem]:
    """POPE question files (JSON lines or a JSON list of {question_id, image, text, label}).

    The split (random / popular / adversarial) is read from each file name. With `n`, the first
    n items of each split are kept (POPE files are already shuffled).
    """
    items: list[EvalItem] = []
    for path in files:
        if not os.path.isfile(path):
            raise ValueError(f"POPE question file not found: {path}")
        with open(path) as f:
            text = f.read().strip()
        try:
            rows = json.loads(text) if text.startswith("[") else [json.loads(line) for line in text.splitlines() if line.strip()]
        except json.JSONDecodeError as e:
            raise ValueError(f"{path} is not JSON lines of POPE questions: {e}") from None
        split = _split_of(path)
        for r in rows[: n or None]:
            missing = {"question_id", "image", "text", "label"} - set(r)
            if missing:
                raise ValueError(f"{path}: a row lacks {sorted(missing)}")
            items.append(EvalItem(id=f"{split}-{r['question_id']}", media=os.path.join(images, r["image"]),
                                  question=r["text"], answer=str(r["label"]).lower(), kind="yesno",
                                  split=split))
    return items
