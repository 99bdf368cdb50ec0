"""The frames of a video as the video methods (VidCom2, FastVID) read them: which visual tokens make
up each frame, from the encoding's geometry.

    grid: (N_V, 3) int64 rows (view, row, col), `TokenGeometry.grid` (the `grid=` input of pool):
          a view is one (frame, kind) of the encoding; tokens outside every grid (OneVision's newline
          after a video, LLaVA-NeXT's row newlines) have view -1.
    frames: (T, n) int64, row t the indices of frame t's tokens in index order, when every view holds the
          same number n of tokens (the frames of a video: Qwen's temporal slices of 2 frames, OneVision's
          pooled frames, InternVL's frames), or every P consecutive views when their sizes repeat with
          period P (Video-LLaVA: a frame's [CLS] view and its patch view, 257 tokens a frame); otherwise (an
          image's base view and tiles of different sizes) the whole input is one frame. Without `grid` (plain tensors)
          the N_V tokens are one frame.
    free:  (M,) int64 the tokens of no view (view -1): they belong to no frame; the video methods keep them,
          as the originals append OneVision's newline after the pruned frames.

Computed on the host from the grid (host metadata, read once per call, never per token) and moved to the
device of the visual tokens.
"""
from __future__ import annotations

import torch

__all__ = ["frame_layout"]


def frame_layout(grid: torch.Tensor | None, n_v: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(frames (T, n), free (M,)) int64 on `device` (see the module docstring); ValueError when `grid`
    is not (N_V, 3)."""
    if grid is None:
        return torch.arange(n_v, device=device)[None, :], torch.zeros(0, dtype=torch.long, device=device)
    if not isinstance(grid, torch.Tensor) or tuple(grid.shape) != (n_v, 3):
        raise ValueError(f"grid must be (N_V, 3) = ({n_v}, 3) rows of (view, row, col), "
                         f"got {tuple(getattr(grid, 'shape', ()))}")
    view = grid[:, 0].detach().to("cpu", torch.long)  # (N_V,) one host copy of the geometry
    on = view >= 0
    idx = torch.arange(n_v, device="cpu")
    free = idx[~on]
    members = idx[on]
    if members.numel() == 0:  # nothing but free tokens: they are the one frame
        return idx[None, :].to(device), free[:0].to(device)
    views, inverse, counts = torch.unique(view[on], return_inverse=True, return_counts=True)  # (V,) tokens each
    period = _period(counts)  # views per frame
    frame = inverse // period  # (members,) each token's frame
    order = torch.argsort(frame, stable=True)  # by frame, then index
    frames = members[order].view(views.numel() // period, -1)  # (T, n)
    return frames.to(device), free.to(device)


def _period(counts: torch.Tensor) -> int:
    """The fewest consecutive views whose sizes repeat over all V views (1: every view one frame; Video-LLaVA's
    [CLS] view and patch view per frame: 2; V: no repeat, the whole input one frame)."""
    v = counts.numel()
    for p in range(1, v + 1):
        if v % p == 0 and bool((counts.view(v // p, p) == counts[:p]).all()):
            return p
    return v
