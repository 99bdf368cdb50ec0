"""Where the family tests look for a drawn square among an encoding's token boxes."""
from __future__ import annotations

import torch


def best_overlap(e, kind: str, frame: int, square) -> torch.Tensor:
    """The token of `kind` in `frame` whose box overlaps `square` most."""
    g = e.geometry
    sel = torch.tensor([k == kind for k in g.kind]) & (g.frame == frame)
    b = g.box
    x0, y0, x1, y1 = square
    ov = ((b[:, 2].clamp(max=x1) - b[:, 0].clamp(min=x0)).clamp(min=0)
          * (b[:, 3].clamp(max=y1) - b[:, 1].clamp(min=y0)).clamp(min=0))
    return torch.where(sel, ov, torch.full_like(ov, -1.0)).argmax()


__all__ = ["best_overlap"]
