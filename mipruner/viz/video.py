"""Drawing a video's selection so it can be read: the frames in a grid (`video_layout`), a timeline of the
tokens each method keeps per frame (`frames_kept`, `timeline`), and the temporal dissimilarity EVS ranks
by as a heatmap over every frame (`temporal_dissimilarity`, `dissimilarity_heatmap`); and which method
parameters concern a video only (`video_params`: a page shows them for a video alone).

Pure functions of (Encoded, Selection) -> arrays and PIL images, like `mipruner.viz`; matplotlib (Agg
canvas, never pyplot) draws the timeline, as `mipruner.viz.colorbar` draws colour bars.

Why a grid: an 8-frame strip of 224 px frames is 1,820 px wide, so a panel a few hundred px wide shows
each frame at ~50 px (3-4 px a patch). Two frames a row keep each frame at half a panel's width
(~190 px at a 1,400 px window with three panels a row, ~170 px on a 390 px phone), every patch >= 8 px.
"""
from __future__ import annotations

import functools
import threading

import numpy as np
import torch
from PIL import Image

from .. import viz
from ..pruners import video as pv
from .layout import Layout, build_layout

GRID_COLUMNS = 2  # frames a row on the page (see the module docstring)
MIN_FRAME_PX = 224  # smaller frames are upscaled in the grid, so a frame is never drawn under ~160 px
DISSIMILARITY_LABEL = "temporal dissimilarity 1 - cos(x[t], x[t-1])"
_LOCK = threading.Lock()  # matplotlib's font cache is shared: one drawing at a time


def n_frames(encoded) -> int:
    return len(encoded.geometry.sizes)


def is_video(encoded) -> bool:
    """A video of several frames (what gets the grid, the timeline and the dissimilarity map)."""
    return bool(getattr(encoded, "is_video", False)) and n_frames(encoded) > 1


def video_layout(encoded, *, columns: int = GRID_COLUMNS, **kw) -> Layout:
    """`build_layout` for the page: a video's frames `columns` a row (upscaled to MIN_FRAME_PX if smaller);
    anything else (an image, LLaVA-NeXT's views of one image) as `build_layout` lays it out."""
    if not is_video(encoded):
        return build_layout(encoded, **kw)
    return build_layout(encoded, columns=columns, min_side=kw.pop("min_side", MIN_FRAME_PX), **kw)


def frames_kept(encoded, selection) -> tuple[np.ndarray, np.ndarray]:
    """(kept, total): per frame, how many of its visual tokens the selection keeps, and has. (F,) int64 each."""
    frame = encoded.geometry.frame.detach().to("cpu", torch.int64)  # (N_V,)
    keep = (selection.keep if hasattr(selection, "keep") else torch.as_tensor(selection)).detach().to("cpu", torch.int64)
    f = n_frames(encoded)
    total = torch.bincount(frame, minlength=f)  # (F,)
    kept = torch.bincount(frame[keep], minlength=f)  # (F,)
    return kept.numpy(), total.numpy()


KEPT_RGB = (42, 120, 142)  # the kept bars (viridis' blue-green); a frame's total in light grey behind


@functools.lru_cache(maxsize=16)  # per (frames' totals, size): the axes a budget move leaves alone
def _axes(total: tuple[int, ...], width: int, height: int):
    """The timeline's fixed part drawn once by matplotlib (axes, ticks, labels, legend, the grey totals):
    (RGB array, bar x extents in px (F, 2), y px of 0 tokens, px per token, font path, font px)."""
    from matplotlib import font_manager
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    f = len(total)
    x = np.arange(1, f + 1)
    font = max(9, round(height / 13))
    dpi = 72  # 1 pt = 1 px
    with _LOCK:
        fig = Figure(figsize=(width / dpi, height / dpi), dpi=dpi, facecolor="white")
        FigureCanvasAgg(fig)
        ax = fig.add_axes([3.6 * font / width, 2.6 * font / height, 1 - 4.4 * font / width,
                           1 - 5.4 * font / height])
        ax.bar(x, total, width=0.8, color="#d9d9d9", label="tokens of the frame")
        ax.bar(x, np.zeros(f), width=0.8, color="#%02x%02x%02x" % KEPT_RGB, label="kept")  # the legend's swatch
        ax.set_xlim(0.4, f + 0.6)
        ax.set_ylim(0, max(total) * 1.18 if max(total) else 1)
        ax.set_xticks(x if f <= 16 else x[:: max(1, f // 8)])
        ax.set_xlabel("frame", fontsize=font, labelpad=0.1 * font)
        ax.set_ylabel("tokens", fontsize=font, labelpad=0.1 * font)
        ax.tick_params(labelsize=0.85 * font, length=0.3 * font, pad=0.15 * font)
        for side in ("top", "right"):
            ax.spines[side].set_visible(False)
        fig.legend(fontsize=0.85 * font, loc="upper right", frameon=False, ncol=2, borderaxespad=0.15,
                   handlelength=1.0, columnspacing=0.8)
        fig.canvas.draw()
        rgb = np.asarray(fig.canvas.buffer_rgba())[..., :3].copy()  # (height, width, 3)
        to_px = ax.transData.transform  # data -> display px, origin bottom-left
        left = to_px(np.stack([x - 0.4, np.zeros(f)], 1))  # (F, 2)
        right = to_px(np.stack([x + 0.4, np.ones(f)], 1))  # (F, 2)
        path = font_manager.findfont("DejaVu Sans")
    bars = np.round(np.stack([left[:, 0], right[:, 0]], 1)).astype(int)  # (F, 2) x0, x1
    zero = height - float(left[0, 1])  # y px (top-left origin) of 0 tokens
    per_token = float(right[0, 1] - left[0, 1])  # px per token
    rgb.setflags(write=False)
    return rgb, bars, zero, per_token, path, font


def _timeline(kept: tuple[int, ...], total: tuple[int, ...], width: int, height: int) -> Image.Image:
    from PIL import ImageDraw, ImageFont

    rgb, bars, zero, per_token, path, font = _axes(total, width, height)
    img = Image.fromarray(rgb.copy())
    draw = ImageDraw.Draw(img)
    base = round(zero) - 1  # the bars' bottom row of pixels
    for (x0, x1), k in zip(bars, kept):  # one rectangle a frame: F <= a few hundred
        if k:  # a kept token is at least one pixel tall, however many the frame has (its top never under its base)
            draw.rectangle((int(x0), min(round(zero - k * per_token), base), max(int(x1) - 1, int(x0)), base),
                           fill=KEPT_RGB)
    if len(total) <= 16:  # the counts over each bar while there is room for them
        face = ImageFont.truetype(path, max(8, round(0.8 * font)))
        for (x0, x1), k, t in zip(bars, kept, total):
            draw.text(((x0 + x1) / 2, zero - t * per_token - 1), f"{k}/{t}", fill=(0, 0, 0), font=face, anchor="md")
    img.info.update(kept=list(kept), total=list(total))
    return img


def timeline(encoded, selection, *, width: int = 480, height: int = 140) -> Image.Image:
    """A bar chart of the tokens kept per frame (kept over the frame's total, frames numbered from 1 as the
    page's frame picker numbers them). Its `info` holds "kept" and "total" (per frame). The axes are drawn
    once per (totals, size); a budget move paints the bars only (~1 ms)."""
    kept, total = frames_kept(encoded, selection)
    return _timeline(tuple(int(k) for k in kept), tuple(int(t) for t in total), int(width), int(height))


def temporal_dissimilarity(encoded) -> torch.Tensor:
    """(N_V,) float32: for a token of frame t >= 1, 1 - cos(x[t], x[t-1]) with the token in the same slot of
    frame t-1 (EVS's score, arXiv 2510.14624; `mipruner.pruners.video.dissimilarity`, whose slots are the
    frame's grid positions); NaN for frame 0 (no previous frame: EVS keeps it) and tokens of no frame
    (row newlines). ValueError when the frames have different numbers of tokens."""
    frames = pv.frame_slots(encoded.frame_index.to(encoded.visual.device), encoded.n_visual)
    d = pv.dissimilarity(encoded.visual, frames)  # (T, P)
    out = torch.full((frames.n,), float("nan"), dtype=torch.float32, device=d.device)  # (N_V,)
    out[frames.index[1:].reshape(-1)] = d[1:].reshape(-1)
    return out


def dissimilarity_heatmap(encoded, values=None, frame: int | None = None, *, layout: Layout | None = None,
                          cmap: str = "viridis", alpha: float = 0.6) -> Image.Image:
    """`values` (default `temporal_dissimilarity`) painted over every frame; tokens without a value (NaN:
    frame 0, which EVS always keeps) are left as the picture. The colours span the values that exist; its
    `info` has "vmin", "vmax", "cmap" and "label" for `with_colorbar`."""
    lay = layout if layout is not None else video_layout(encoded)
    d = temporal_dissimilarity(encoded) if values is None else values
    d = d.detach().to("cpu", torch.float32).numpy() if isinstance(d, torch.Tensor) else np.asarray(d, np.float32)
    heat = np.asarray(viz.scores_heatmap(encoded, d, layout=lay, cmap=cmap, alpha=alpha))  # (H, W, 3)
    lo, hi = viz.value_range(d, lay.has_box)
    none = np.concatenate([[True], ~np.isfinite(d)])[lay.label + 1]  # (H, W): no token, or no value
    img = Image.fromarray(lay.crop(np.where(none[..., None], lay.base, heat), frame))
    img.info.update(vmin=lo, vmax=hi, cmap=cmap, label=DISSIMILARITY_LABEL, colorbar="below")
    return img


def video_params() -> list[str]:
    """The method parameters that mean something on a video only (what a page shows for a video alone), in
    registry order: the video methods' own (EVS's rate; `MethodSpec.video`) and the per-frame budget split
    every other pre-LLM method gets (`PER_FRAME`)."""
    from ..pruners import all_params, get_pruner, list_pruners
    from ..pruners.per_frame import PER_FRAME

    specs = [get_pruner(n) for n in list_pruners()]
    own = {p for s in specs if s.video for p in s.param_names} - {p for s in specs if not s.video for p in s.param_names}
    return [n for n in all_params() if n in own or n == PER_FRAME.name]


def temporal_values(encoded, selection) -> torch.Tensor | None:
    """The temporal dissimilarity a selection ranked by, when it did: a temporal method (EVS) leaves it in
    `Selection.extras` as "dissimilarity" (T, P) per frame slot and "frames" (T, P), the slots' token indices
    (`mipruner.pruners.video`). Returns (N_V,) float32 with NaN on frame 0 (no previous frame: EVS keeps it
    whole) and on tokens of no frame; None for an image or a method without them."""
    extras = getattr(selection, "extras", {})
    d, frames = extras.get("dissimilarity"), extras.get("frames")
    if d is None or frames is None or not is_video(encoded):
        return None
    d = torch.as_tensor(d).detach().to(torch.float32)  # (T, P)
    index = torch.as_tensor(frames).to(device=d.device, dtype=torch.int64)  # (T, P)
    out = torch.full((encoded.n_visual,), float("nan"), dtype=torch.float32, device=d.device)  # (N_V,)
    out[index[1:].reshape(-1)] = d[1:].reshape(-1)
    return out


__all__ = ["DISSIMILARITY_LABEL", "GRID_COLUMNS", "MIN_FRAME_PX", "dissimilarity_heatmap", "frames_kept",
           "is_video", "n_frames", "temporal_dissimilarity", "temporal_values", "timeline", "video_layout", "video_params"]
