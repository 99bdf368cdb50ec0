"""Video-shaped inputs for the video methods' tests: T frames of n tokens with a temporal structure (scenes of
similar frames, cuts between them), their frame_index, and encoder attention."""
from __future__ import annotations

from collections import namedtuple

import torch

TopK = namedtuple("TopK", "values indices")


def stable_topk(x: torch.Tensor, k: int, dim: int = -1, largest: bool = True, sorted: bool = True) -> TopK:
    """torch.topk with ties to the lower index (a stable sort), for restatements run on inputs whose scores
    tie (the release's torch.topk leaves ties to the kernel; the methods here break them this way)."""
    idx = torch.sort(x, dim=dim, descending=largest, stable=True).indices.narrow(dim, 0, k)
    return TopK(torch.gather(x, dim, idx), idx)


def video_frames(t: int, n: int, *, newline: bool = False) -> torch.Tensor:
    """(T n [+1],) frame_index: T frames of n tokens; with `newline`, one token of no frame (-1) at the end
    (OneVision's)."""
    index = torch.arange(t).repeat_interleave(n)
    return torch.cat([index, torch.tensor([-1])]) if newline else index


def video_tokens(t: int, n: int, d: int, *, scenes: tuple[int, ...] = (0,), noise: float = 0.3,
                 seed: int = 0) -> torch.Tensor:
    """(T n, d): each frame its scene's n base tokens plus noise; a scene starts at each frame in `scenes`."""
    g = torch.Generator().manual_seed(seed)
    rows, base = [], None
    for f in range(t):
        if f in scenes or base is None:
            base = torch.randn(n, d, generator=g)
        rows.append(base + noise * torch.randn(n, d, generator=g))
    return torch.cat(rows)


def attention(n_v: int, seed: int = 0) -> torch.Tensor:
    """(N_V + 1, N_V + 1) head-mean attention probabilities with [CLS] first."""
    g = torch.Generator().manual_seed(seed)
    return torch.softmax(torch.randn(n_v + 1, n_v + 1, generator=g) * 3, dim=-1)
