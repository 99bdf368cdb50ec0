"""Per-frame budgets: any pre-LLM method run on each frame of a video alone, its share of the budget each.

The registry gives every pre-LLM method but the video ones (which share their budget over time themselves)
the parameter `per_frame` (`_registry.PER_FRAME`), consumed by `run_pre_llm`:
    off         the method on the video's tokens as one flat set (what it does on an image);
    even        K split over the frames in proportion to their sizes (equal frames: K / T each, the
                remainder to the earlier frames);
    uniqueness  K split in proportion to each frame's mean EVS dissimilarity, mean_p 1 - cos(x[t, p],
                x[t - 1, p]) ("Efficient Video Sampling", arXiv 2510.14624); frame 0, which has no previous
                frame, is compared with an empty one (cosine 0), so its weight is 1, that of an all-new frame.
A frame's share never exceeds its tokens (the excess goes to the others, `video.split_budget`); a frame given 0
tokens is skipped. The method then runs on frame t alone (its visual rows; attention, keys and per-head
attention restricted to the frame, the [CLS] row kept first where there is one; `features` and `grid` rows;
`cls` row t where there is one per frame) with budget k_t, and the keeps are joined: keep = the union, order
= the frames' orders one frame after another, scores, pmi and pivot in the frames' rows, merged tokens,
`merged_into` and `prefix` rows mapped back to the video's indices. Tokens of no frame (OneVision's closing
newline) are kept only when K exceeds every frame's tokens (as `pool` drops them first), so K = N_V keeps all.
A method's `cache=` is not used per frame (its entries belong to the whole encoding's tensors). Without a
`frame_index` (plain tensors given to `prune`), or on one frame (an image), the input is one frame and the
method runs as with "off", except that tokens of no frame (row newlines) go last. `extras["frame_budgets"]` (T,) int64 and `extras["frame_weights"]` (T,) float32
say how the budget was shared.
"""
from __future__ import annotations

from typing import Callable

import torch

from .param import Param
from .selection import Selection
from .video import Frames, frame_slots, split_budget, uniqueness

SPLITS = ("off", "even", "uniqueness")
PER_FRAME = Param.choice(
    "per_frame", "off", SPLITS,
    "per-frame budgets on a video: off (one flat set of tokens), even (the budget shared evenly over the frames) "
    "or uniqueness (by each frame's mean dissimilarity to the previous one, EVS's); the method then runs on "
    "each frame alone", code="pf")
_SQUARE = ("attention", "attention_heads")


def frame_inputs(inputs: dict, frames: Frames, t: int, own: tuple[str, ...]) -> dict:
    """The encoding inputs a method takes (`own`), restricted to frame t (module docstring)."""
    idx, n = frames.index[t], frames.n
    out = {}
    for name in own:
        x = inputs.get(name)
        if not isinstance(x, torch.Tensor) or name in ("cache",):
            out[name] = None if name == "cache" else x
            continue
        if name in _SQUARE or name == "keys":
            rows = idx if x.shape[-2 if name in _SQUARE else 0] == n else \
                torch.cat([torch.zeros(1, dtype=idx.dtype, device=idx.device), idx + 1])  # [CLS] first
            rows = rows.to(x.device)
            out[name] = x.index_select(-1, rows).index_select(-2, rows) if name in _SQUARE else x.index_select(0, rows)
        elif name == "cls":
            out[name] = x[t:t + 1] if x.shape[0] == frames.count else x
        else:  # features, grid, frame_index: one row per visual token
            out[name] = x.index_select(0, idx.to(x.device))
    return out


def frame_budgets(visual: torch.Tensor, frames: Frames, k: int, split: str) -> tuple[list[int], torch.Tensor]:
    """(tokens per frame, summing to min(k, T P); the (T,) float32 weights they were shared by)."""
    sizes = [frames.per_frame] * frames.count
    if split == "uniqueness":
        w = uniqueness(visual, frames)
        weights = w.cpu().tolist()  # T numbers, one host copy
    elif split == "even":
        w = torch.ones(frames.count, dtype=torch.float32, device=visual.device)
        weights = None
    else:
        raise ValueError(f"per_frame must be one of {SPLITS}, got {split!r}")
    return split_budget(min(k, frames.count * frames.per_frame), sizes, weights), w


def run(call: Callable[[torch.Tensor, int, dict], Selection], visual: torch.Tensor, k: int, inputs: dict,
        split: str, own: tuple[str, ...]) -> Selection:
    """The method `call(visual_t, k_t, inputs_t)` on each frame alone, the keeps joined (module docstring)."""
    n, dev = visual.shape[0], visual.device
    frames = frame_slots(inputs.get("frame_index"), n, dev)
    budgets, weights = frame_budgets(visual, frames, k, split)
    parts = [(frames.index[t], call(visual.index_select(0, frames.index[t]), kt, frame_inputs(inputs, frames, t, own)))
             for t, kt in enumerate(budgets) if kt > 0]
    extra_out = frames.outside[: k - sum(budgets)]  # tokens of no frame, once every frame is kept whole
    sel = join(parts, extra_out, visual)
    sel.extras.update(per_frame=split, frame_budgets=torch.tensor(budgets, dtype=torch.long, device=dev),
                      frame_weights=weights.to(torch.float32))
    return sel


def join(parts: list[tuple[torch.Tensor, Selection]], outside: torch.Tensor, visual: torch.Tensor) -> Selection:
    """One Selection over the video's N_V tokens from each frame's (its token indices, its selection), plus the
    kept tokens of no frame `outside` (module docstring)."""
    n, dev = visual.shape[0], visual.device
    order = torch.cat([idx[s.order] for idx, s in parts] + [outside])
    scores = torch.zeros(n, dtype=torch.float32, device=dev)
    for idx, s in parts:
        scores[idx] = s.scores
    kw: dict = {}
    kept = torch.cat([idx[s.keep] for idx, s in parts] + [outside])  # frame by frame, each ascending
    perm = torch.argsort(kept)
    if any(s.tokens is not None for _, s in parts):
        rows = [s.tokens.to(visual.dtype) if s.tokens is not None else visual[idx[s.keep]] for idx, s in parts]
        kw["tokens"] = torch.cat(rows + [visual[outside]])[perm]
    if any(s.merged_into is not None for _, s in parts):
        into = torch.full((n,), -1, dtype=torch.long, device=dev)
        for idx, s in parts:
            if s.merged_into is not None:
                m = s.merged_into
                into[idx] = torch.where(m >= 0, idx[m.clamp(min=0)], torch.full_like(m, -1))
        kw["merged_into"] = into
    prefixes = [s.prefix for _, s in parts if s.prefix is not None]
    if prefixes:
        kw["prefix"] = torch.cat(prefixes)
    if parts and all(s.pmi is not None and s.pivot is not None for _, s in parts):
        pmi = torch.zeros(n, parts[0][1].pmi.shape[1], dtype=parts[0][1].pmi.dtype, device=dev)
        pivot = torch.zeros(n, dtype=torch.long, device=dev)
        for idx, s in parts:
            pmi[idx] = s.pmi
            pivot[idx] = s.pivot
        kw.update(pmi=pmi, pivot=pivot)
    return Selection(keep=kept[perm], order=order, scores=scores, **kw)


__all__ = ["PER_FRAME", "SPLITS", "frame_budgets", "frame_inputs", "join", "run"]
