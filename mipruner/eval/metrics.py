"""Scoring answers (POPE accuracy / F1 / yes-rate, open-answer match) and query recall.

This is the one scoring module: `python -m mipruner.eval` and the lmms-eval tasks of
`mipruner.lmms` (`mipruner.lmms.tasks`) both score with `pope_metrics` / `open_metrics`, and
both average POPE's splits with `average_splits`.

Query recall is the measure the synthetic scenes make possible: the share of the asked object's
visual tokens that a pruner keeps. A token "shows" the object when at least `min_cover` of its
pixel box is object pixels (in the original image / frame coordinates of `TokenGeometry`); the
default is the scenes' own definition, `scenes.PATCH_MIN_COVER`, which the trainer's recall
report and the model test use too, so every recall figure means the same thing.
"""
from __future__ import annotations

import math
import re

import numpy as np
import torch

from mipruner.shapes.scenes import PATCH_MIN_COVER

NUMBER_WORDS = {"zero": "0", "one": "1", "two": "2", "three": "3", "four": "4", "five": "5",
                "six": "6", "seven": "7", "eight": "8", "nine": "9", "ten": "10"}


def normalize_answer(text: str) -> str:
    """Lower-case first word without punctuation; number words become digits."""
    words = re.findall(r"[a-z0-9]+", text.lower())
    if not words:
        return ""
    return NUMBER_WORDS.get(words[0], words[0])


def parse_yes_no(text: str) -> str:
    """'yes', 'no' or '' (neither) from a free answer, as POPE's evaluation does (first yes/no word)."""
    for w in re.findall(r"[a-z]+", text.lower()):
        if w in ("yes", "no"):
            return w
    return ""


def answer_matches(prediction: str, answer: str) -> bool:
    """Open answers are scored on their first word (`normalize_answer`); an empty one never matches."""
    return normalize_answer(prediction) == normalize_answer(answer) != ""


def pope_metrics(predictions: list[str], labels: list[str]) -> dict[str, float]:
    """Accuracy, precision, recall, F1 (positive class 'yes') and the share of 'yes' answers.

    An answer that is neither yes nor no counts as 'no', as in POPE's reference script.
    """
    if not labels:
        return {"acc": float("nan"), "f1": float("nan"), "yes_rate": float("nan"), "n": 0}
    pred = np.array([parse_yes_no(p) == "yes" for p in predictions])
    gold = np.array([parse_yes_no(lab) == "yes" for lab in labels])
    tp = int((pred & gold).sum())
    fp = int((pred & ~gold).sum())
    fn = int((~pred & gold).sum())
    precision = tp / (tp + fp) if tp + fp else 0.0
    recall = tp / (tp + fn) if tp + fn else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"acc": float((pred == gold).mean()), "precision": precision, "recall": recall, "f1": f1,
            "yes_rate": float(pred.mean()), "n": len(labels)}


def open_metrics(predictions: list[str], answers: list[str]) -> dict[str, float]:
    """Accuracy of one-word open answers (`answer_matches`: first word, number words as digits)."""
    if not answers:
        return {"acc": float("nan"), "n": 0}
    hits = sum(answer_matches(p, a) for p, a in zip(predictions, answers, strict=True))
    return {"acc": hits / len(answers), "n": len(answers)}


def average_splits(per_split: list[dict], keys=("acc", "f1", "yes_rate")) -> dict[str, float]:
    """The paper's POPE "average": the unweighted mean of each metric over the splits (NaNs skipped)."""
    out = {}
    for k in keys:
        vals = [float(r[k]) for r in per_split if k in r and not math.isnan(float(r[k]))]
        out[k] = sum(vals) / len(vals) if vals else float("nan")
    return out


def token_object_cover(geometry, masks: list[np.ndarray]) -> torch.Tensor:
    """(N_V,) share of each visual token's pixel box covered by the object mask of its frame.

    masks: one (H, W) bool array per frame (original resolution); tokens without a box
    (e.g. LLaVA-NeXT newline tokens) get 0.
    """
    n = len(geometry)
    cover = torch.zeros(n)
    integrals = []
    for m in masks:
        ii = np.zeros((m.shape[0] + 1, m.shape[1] + 1), dtype=np.int64)
        ii[1:, 1:] = np.cumsum(np.cumsum(m.astype(np.int64), 0), 1)  # summed-area table
        integrals.append(ii)
    for t in range(n):
        f = int(geometry.frame[t])
        if f >= len(integrals):
            continue
        ii = integrals[f]
        h, w = ii.shape[0] - 1, ii.shape[1] - 1
        x0, y0, x1, y1 = geometry.box[t].tolist()
        x0, y0 = max(0, int(round(x0))), max(0, int(round(y0)))
        x1, y1 = min(w, int(round(x1))), min(h, int(round(y1)))
        if x1 <= x0 or y1 <= y0:
            continue
        inside = ii[y1, x1] - ii[y0, x1] - ii[y1, x0] + ii[y0, x0]
        cover[t] = inside / float((x1 - x0) * (y1 - y0))
    return cover


def query_recall(keep: torch.Tensor | None, cover: torch.Tensor, min_cover: float = PATCH_MIN_COVER) -> float:
    """Share of the object's tokens (cover >= min_cover) that `keep` retains; NaN if none."""
    obj = cover >= min_cover
    total = int(obj.sum())
    if total == 0:
        return float("nan")
    if keep is None:
        return 1.0
    return int(obj[keep.to(obj.device)].sum()) / total  # a Selection's keep lives on the model's device
