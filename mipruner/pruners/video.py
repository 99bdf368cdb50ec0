"""Video geometry for the pre-LLM methods: which frame each visual token comes from, each frame's tokens as
slots that line up across frames, the dissimilarity of a token to the same slot of the previous frame, and a
budget split over frames. Shared by the video methods (EVS, ...) and the per-frame option of every image
method (`per_frame.py`).

    frame_index: (N_V,) int64, the frame each visual token belongs to (a method's `frame_index=` input,
        `Encoded.frame_index`), -1 for tokens that belong to no frame's grid (row newlines, OneVision's
        closing newline). A "frame" is what the encoding's geometry calls one (`TokenGeometry.frame`): for
        Qwen a token-frame (a temporal grid slice of `temporal_patch_size` = 2 sampled frames), for every
        other family one sampled frame (LLaVA-1.5 reads them as images).
    Frames: the frames' tokens as a (T, P) table of token indices: slot p of frame t is the frame's p-th
        token in index order (for Qwen, InternVL, OneVision and LLaVA-1.5 the (h, w) raster of its H' x W'
        grid; Video-LLaVA's frames start with their [CLS] token, slot 0); `outside` the tokens of no frame.
        Every frame must have the same number of tokens, else ValueError naming the frames.
    dissimilarity: (T, P) float32, 1 - cos(x[t, p], x[t - 1, p]) for t >= 1 (the rule of "Efficient Video
        Sampling", arXiv 2510.14624); row 0, which has no previous frame, is compared with an empty frame
        (cosine 0 with a zero vector, so 1).
    split_budget: K tokens over frames, in proportion to weights (their sizes: "even"; their mean
        dissimilarity: "uniqueness"), none above its size, largest remainder with ties to the earlier frame.

The frame table is host metadata (the geometry lives on the host): it is laid out on the host once per (frame_index
content, N_V, device) and memoized on the device (as `pool`'s cells), so a call afterwards (a CUDA-graph replay
included) is device work only; callers never write into its tensors.
"""
from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F

OUTSIDE = -1  # the frame_index of a token in no frame's grid


class NotApplicable(ValueError):
    """A method that does not apply to this input (a video method on an image or a 1-frame video): its sentence
    says why. The app shows it in that method's panel alone (`mipruner.serve.failures`), the other methods still run."""


def token_frames(frame: torch.Tensor, kind: Sequence[str]) -> torch.Tensor:
    """(N_V,) int64 frame of each token from a geometry's `frame` and `kind` (`TokenGeometry`): the frame,
    or -1 (`OUTSIDE`) for row newlines, which sit outside every frame's grid."""
    out = frame.to(torch.long).clone()
    newline = torch.tensor([k == "newline" for k in kind], dtype=torch.bool, device=out.device)
    return torch.where(newline, torch.full_like(out, OUTSIDE), out)


@dataclass(frozen=True)
class Frames:
    """The frames of one encoding (module docstring): `index` (T, P) int64 token index of slot p of frame t,
    on the device the table was asked for; `outside` (M,) int64 ascending, tokens of no frame; `n` = N_V."""

    index: torch.Tensor
    outside: torch.Tensor
    n: int

    @property
    def count(self) -> int:
        """T, the number of frames."""
        return int(self.index.shape[0])

    @property
    def per_frame(self) -> int:
        """P, the tokens of each frame."""
        return int(self.index.shape[1])


# (frame_index content, N_V, device) -> Frames; bounded (least recently used dropped)
_TABLES: "OrderedDict[tuple, Frames]" = OrderedDict()
# (id of the frame_index tensor, N_V, device) -> (weak reference to it, its version counter, Frames): the lookup
# made before any host copy, so a call on the same index tensor (an encoding's, every budget and replay) reads
# nothing from the device; an in-place write bumps the tensor's version and misses. Bounded as _TABLES.
_BY_TENSOR: "OrderedDict[tuple, tuple]" = OrderedDict()
MAX_TABLES = 64
_LOCK = threading.Lock()


def _same_tensor(key: tuple, frame_index: torch.Tensor) -> Frames | None:
    entry = _BY_TENSOR.get(key)
    if entry is None or entry[0]() is not frame_index or entry[1] != frame_index._version:
        return None
    _BY_TENSOR.move_to_end(key)
    return entry[2]


def clear_tables() -> None:
    """Forget every memoized frame table (tests lay tables out afresh, e.g. under a meta default device)."""
    with _LOCK:
        _TABLES.clear()
        _BY_TENSOR.clear()


def frame_slots(frame_index: torch.Tensor | None, n: int, device: torch.device | str | None = None) -> Frames:
    """The `Frames` of `n` visual tokens from their `frame_index` (None: one frame of every token), on
    `device` (default: frame_index's), memoized (module docstring). ValueError, naming the field, when
    frame_index is not (n,) integers >= -1 or when the frames have different numbers of tokens (frames of
    different sizes)."""
    dev = torch.device(device) if device is not None else (
        frame_index.device if isinstance(frame_index, torch.Tensor) else torch.device("cpu"))
    # inference tensors (made under torch.inference_mode) keep no version counter: the content memo alone
    by_tensor = (id(frame_index), n, str(dev)) if isinstance(frame_index, torch.Tensor) \
        and not frame_index.is_inference() else None
    if by_tensor is not None:
        with _LOCK:  # looked up first: no host copy (no device sync) for a tensor seen before
            hit = _same_tensor(by_tensor, frame_index)
        if hit is not None:
            return hit
    host = _host_index(frame_index, n)  # one host copy, the memo's key and the layout's input
    key = (None if host is None else (str(frame_index.dtype), hash(host.tobytes())), n, str(dev))
    with _LOCK:
        out = _TABLES.get(key)
        if out is not None:
            _TABLES.move_to_end(key)
    if out is None:
        out = _frame_slots(host, n, dev)
    with _LOCK:
        _TABLES[key] = out
        while len(_TABLES) > MAX_TABLES:
            _TABLES.popitem(last=False)
        if by_tensor is not None:
            _BY_TENSOR[by_tensor] = (weakref.ref(frame_index), frame_index._version, out)
            while len(_BY_TENSOR) > MAX_TABLES:
                _BY_TENSOR.popitem(last=False)
    return out


def _host_index(frame_index: torch.Tensor | None, n: int) -> np.ndarray | None:
    """frame_index as (n,) int64 on the host (one copy), or ValueError naming it."""
    if frame_index is None:
        return None
    if not isinstance(frame_index, torch.Tensor) or tuple(frame_index.shape) != (n,) \
            or frame_index.is_floating_point() or frame_index.dtype == torch.bool:
        raise ValueError(f"frame_index must be ({n},) integers, one frame per visual token, "
                         f"got {getattr(frame_index, 'shape', type(frame_index).__name__)}")
    return frame_index.detach().cpu().numpy().astype(np.int64)


def _frame_slots(f: np.ndarray | None, n: int, dev: torch.device) -> Frames:
    if f is None:
        return Frames(torch.arange(n, device=dev)[None], torch.zeros(0, dtype=torch.long, device=dev), n)
    if f.size and f.min() < OUTSIDE:
        raise ValueError(f"frame_index must hold frames >= 0 (or -1 for tokens of no frame), got {int(f.min())}")
    inside = f >= 0
    ids, counts = np.unique(f[inside], return_counts=True)
    if ids.size == 0:
        raise ValueError("frame_index puts no visual token in any frame")
    if np.any(counts != counts[0]):
        bad = int(np.flatnonzero(counts != counts[0])[0])
        raise ValueError(f"frames of different sizes: frame {int(ids[0])} has {int(counts[0])} visual tokens, "
                         f"frame {int(ids[bad])} has {int(counts[bad])}; a video's frames must share one size")
    order = np.argsort(f * (n + 1) + np.arange(n), kind="stable")  # by frame, then index
    table = order[int((~inside).sum()):].reshape(ids.size, int(counts[0]))
    host = lambda a: torch.from_numpy(np.ascontiguousarray(a)).to(dev)  # noqa: E731
    return Frames(host(table), host(np.flatnonzero(~inside)), n)


def dissimilarity(visual: torch.Tensor, frames: Frames) -> torch.Tensor:
    """(T, P) float32: 1 - cos(x[t, p], x[t - 1, p]) for t >= 1; row 0 against an empty frame (1)."""
    x = visual.to(torch.float32)[frames.index]  # (T, P, d)
    first = torch.ones_like(x[:1, :, 0])
    return torch.cat([first, 1 - F.cosine_similarity(x[1:], x[:-1], dim=-1)], 0)


def uniqueness(visual: torch.Tensor, frames: Frames) -> torch.Tensor:
    """(T,) float32: each frame's mean `dissimilarity` (frame 0: 1, all new), at least 0: a frame that repeats
    the previous one gives 1 - cos a rounding error below 0 (-1e-8), which is no weight."""
    return dissimilarity(visual, frames).clamp_min(0).mean(1)


def split_budget(k: int, sizes: Sequence[int], weights: Sequence[float] | None = None) -> list[int]:
    """k tokens over frames of `sizes` tokens, in proportion to `weights` (None: the sizes, an even split),
    none above its size: water-filling (a frame whose share reaches its size keeps all of it, the rest is
    shared again among the others), then floors plus the largest remainders, ties to the earlier frame.
    Frames of weight 0 get tokens only when the others are full. Host arithmetic on T numbers."""
    sizes = [int(s) for s in sizes]
    if not 0 <= k <= sum(sizes):
        raise ValueError(f"a budget of {k} tokens does not fit frames of {sum(sizes)} tokens")
    w = np.asarray(sizes if weights is None else weights, dtype=np.float64)
    if w.shape != (len(sizes),) or not np.all(np.isfinite(w)) or np.any(w < 0):
        raise ValueError(f"weights must be {len(sizes)} finite numbers >= 0, got {weights!r}")
    size = np.asarray(sizes, dtype=np.float64)
    share = np.zeros(len(sizes))
    full = np.zeros(len(sizes), dtype=bool)
    left = float(k)
    while left > 0:
        open_ = ~full & (size > share)
        wo = np.where(open_, w, 0.0)
        if wo.sum() <= 0:  # only weightless frames have room: share what is left by their room
            wo = np.where(open_, size - share, 0.0)
        give = left * wo / wo.sum()
        over = open_ & (share + give >= size)
        if not over.any():
            share += give
            break
        left -= float((size[over] - share[over]).sum())
        share[over] = size[over]
        full |= over
    base = np.minimum(np.floor(share + 1e-9), size).astype(np.int64)
    rest = k - int(base.sum())
    room = base < size
    frac = np.where(room, share - base, -np.inf)
    for i in sorted(range(len(sizes)), key=lambda i: (-frac[i], i))[:rest]:
        base[i] += 1
    return base.tolist()


__all__ = ["Frames", "NotApplicable", "OUTSIDE", "clear_tables", "dissimilarity", "frame_slots", "split_budget", "token_frames", "uniqueness"]
