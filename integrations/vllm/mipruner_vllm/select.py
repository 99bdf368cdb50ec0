"""The worker's side: one image's projected tokens -> the K rows the LLM reads, chosen by `mipruner.prune`.

Runs in vLLM's `embed_multimodal`, on the request the front end already checked (`request.parse`),
so nothing here should raise for a user's input. `RECORD` keeps the last selections made in this
process (bounded) when MIPRUNER_VLLM_RECORD=1: the tests read the kept indices from it.
"""
from __future__ import annotations

import collections
import os

import torch

from mipruner.pruners._registry import get_pruner, prune

from .request import PruneRequest

RECORD: collections.deque = collections.deque(maxlen=64)


def grid_rows(h: int, w: int, device, t: int = 1) -> torch.Tensor:
    """(t*h*w, 3) int64 rows (frame, row, col) of one medium's token grid, row-major per frame (pool's `grid`)."""
    f = torch.arange(t, device=device).repeat_interleave(h * w)
    r = torch.arange(h, device=device).repeat_interleave(w).repeat(t)
    c = torch.arange(w, device=device).repeat(h * t)
    return torch.stack([f, r, c], dim=1)


def image_frames(grid: torch.Tensor) -> torch.Tensor:
    """(N,) frames of one anyres image's tokens from its (N, 3) (view, row, col) grid, as `Encoded.frame_index`
    gives them: 0, and -1 (no frame) for its row newlines (view -1)."""
    return torch.where(grid[:, 0] < 0, -1, 0)


def choose(req: PruneRequest, visual: torch.Tensor, embed_ids, hw: tuple[int, int] | None = None, frames: int = 0,
           grid: torch.Tensor | None = None, frame_index: torch.Tensor | None = None):
    """(rows, keep): the (K, d) rows to feed and the (K,) kept indices into the medium's N tokens.
    embed_ids: (Q,) ids -> (Q, d) the LLM's input embeddings (the query's T); hw: one frame's token grid;
    frames: a video's frames along time (its tokens frame-major, `frame_index` given), 0 for an image;
    grid, frame_index: (N, 3) (view, row, col) and (N,) frames given whole instead of hw and frames (LLaVA-NeXT:
    views and row newlines; `Encoded.frame_index` of an image, 0 and -1 for the newlines, for the per-frame option)."""
    spec = get_pruner(req.method)
    text = None
    if req.query_ids:
        ids = torch.tensor(req.query_ids, dtype=torch.long, device=visual.device)
        text = embed_ids(ids).to(visual.dtype)
    if "grid" in spec.inputs:
        extra = {"grid": grid if grid is not None else grid_rows(*hw, visual.device, max(frames, 1))}
    else:
        extra = {}
    if frame_index is not None and "frame_index" in spec.accepts:
        extra["frame_index"] = frame_index
    elif frames and "frame_index" in spec.accepts:
        extra["frame_index"] = torch.arange(frames, device=visual.device).repeat_interleave(hw[0] * hw[1])
    sel = prune(req.method, visual=visual, text=text if "text" in spec.needs else None,
                budget=req.k(visual.shape[0], max(frames, 1)), **req.params, **extra)
    rows = sel.tokens.to(visual.dtype) if sel.tokens is not None else visual[sel.keep]
    if os.environ.get("MIPRUNER_VLLM_RECORD") == "1":
        RECORD.append({"method": req.method, "n": int(visual.shape[0]), "keep": sel.keep.cpu()})
    return rows, sel.keep
