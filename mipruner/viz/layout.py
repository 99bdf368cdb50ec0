"""The per-encoding picture that every render of `mipruner.viz` reuses (`Layout`, `build_layout`):
the frames (one row, or a grid of `columns` per row: a video on the app's page), its dimmed copy, the label map of which visual token covers each pixel, and
the token-grid outline. Built once per encoding (the engine caches it); see `mipruner.viz`.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from PIL import Image

NO_BOX_KINDS = ("newline",)
BACKGROUND = (255, 255, 255)  # between frames of the strip


@dataclass
class Layout:
    """Everything about one encoding's picture that renders reuse.

    base: (H, W, 3) uint8 strip of frames; dimmed: the same, darkened inside frames;
    label: (H, W) int32, the visual token covering each pixel (-1: none); edges: (H, W) bool,
    token-grid lines; rects: (N_V, 4) int32 (x0, y0, x1, y1) in strip pixels; has_box: (N_V,) bool;
    frame_x, frame_y: per frame its offset in the picture (frame_y all 0 for one row); frame_wh: per frame
    its size there; scales: per frame (sx, sy) picture px per original px.
    """

    base: np.ndarray
    dimmed: np.ndarray
    label: np.ndarray
    edges: np.ndarray
    rects: np.ndarray
    has_box: np.ndarray
    frame_x: list[int]
    frame_y: list[int]
    frame_wh: list[tuple[int, int]]
    scales: list[tuple[float, float]]
    blend_base: dict = field(default_factory=dict, repr=False)  # alpha (of 256) -> (H, W, 3) uint16
    pictures: dict = field(default_factory=dict, repr=False)  # base / dimmed as PIL images, label + 1

    def composite(self, clear: np.ndarray) -> Image.Image:
        """The strip with the tokens whose `clear` entry is 255 shown as they are and the rest (and
        pixels no token covers) dimmed. clear: (N_V + 1,) uint8, entry 0 for "no token" (PIL's
        composite in C: a few times faster than a masked numpy copy of the strip)."""
        if not self.pictures:
            self.pictures.update(base=Image.fromarray(self.base), dimmed=Image.fromarray(self.dimmed),
                                 index=self.label + 1)
        return Image.composite(self.pictures["base"], self.pictures["dimmed"],
                               Image.fromarray(clear[self.pictures["index"]]))

    def base_term(self, a: int) -> np.ndarray:
        """base * (256 - a) under tokens, the dimmed strip * 256 elsewhere: the fixed half of a blend. Pixels
        no token covers (outside a centre crop) are dimmed as the masks dim them: the model never read them."""
        if a not in self.blend_base:
            covered = (self.label >= 0)[..., None]
            b16 = self.base.astype(np.uint16)
            self.blend_base[a] = np.where(covered, b16 * (256 - a), self.dimmed.astype(np.uint16) * 256
                                          ).astype(np.uint16)
        return self.blend_base[a]

    @property
    def size(self) -> tuple[int, int]:
        return int(self.base.shape[1]), int(self.base.shape[0])

    def frame_box(self, frame: int) -> tuple[int, int, int, int]:
        """(x0, y0, x1, y1) of one frame in the picture; ValueError for a frame it does not have."""
        if not 0 <= frame < len(self.frame_x):
            raise ValueError(f"frame must be in [0, {len(self.frame_x) - 1}], got {frame}")
        x, y, (w, h) = self.frame_x[frame], self.frame_y[frame], self.frame_wh[frame]
        return x, y, x + w, y + h

    def crop(self, arr: np.ndarray, frame: int | None) -> np.ndarray:
        """`arr` (H, W, ...) cut to one frame's region, or whole when frame is None."""
        if frame is None:
            return arr
        x0, y0, x1, y1 = self.frame_box(frame)
        return arr[y0:y1, x0:x1]

    def locate(self, x: float, y: float) -> tuple[int, float, float] | None:
        """A picture pixel -> (frame, x, y) in that frame's original coordinates, or None (gap)."""
        for f, (fx, fy, (w, h), (sx, sy)) in enumerate(zip(self.frame_x, self.frame_y, self.frame_wh, self.scales)):
            if fx <= x < fx + w and fy <= y < fy + h:
                return f, (x - fx) / sx, (y - fy) / sy
        return None


def build_layout(encoded, *, max_side: int = 768, gap: int = 4, dim: float = 0.3,
                 grid_color: tuple[int, int, int] = (255, 255, 255), grid_alpha: float = 0.25,
                 columns: int | None = None, min_side: int = 0) -> Layout:
    """The per-encoding picture: frames, their dimmed copy, label map and grid edges (see `Layout`).

    max_side: frames whose longer side exceeds it are downscaled for display; min_side: frames whose
    shorter side is below it are upscaled (never past max_side); dim: brightness factor of dropped
    patches; grid_alpha: opacity of the token-grid outline (0 = none); columns: frames per row,
    filled left to right, then top to bottom, `gap` px apart both ways (None: one row, a strip).
    """
    geo = encoded.geometry
    n_frames = len(geo.sizes)
    if len(encoded.frames) < n_frames:
        raise ValueError(f"encoding has {len(encoded.frames)} frames but geometry names {n_frames}")
    scales, whs = [], []
    for w, h in geo.sizes:
        s = min(max(1.0, min_side / min(w, h)), max_side / max(w, h)) if min_side else min(1.0, max_side / max(w, h))
        sw, sh = max(1, round(w * s)), max(1, round(h * s))
        scales.append((sw / w, sh / h))
        whs.append((sw, sh))
    frame_x, frame_y = _place(whs, columns or n_frames, gap)
    W = max(x + w for x, (w, _) in zip(frame_x, whs))
    H = max(y + h for y, (_, h) in zip(frame_y, whs))
    base = np.empty((H, W, 3), dtype=np.uint8)
    base[:] = BACKGROUND
    inside = np.zeros((H, W), dtype=bool)
    for f in range(n_frames):
        im = encoded.frames[f].convert("RGB")
        if im.size != whs[f]:
            im = im.resize(whs[f], Image.BILINEAR)
        x, y, (w, h) = frame_x[f], frame_y[f], whs[f]
        base[y:y + h, x:x + w] = np.asarray(im)
        inside[y:y + h, x:x + w] = True

    # token boxes -> strip rectangles (rounded the same way on both sides: neighbours share edges)
    box = geo.box.detach().to(torch.float64).cpu().numpy()  # (N_V, 4) original px
    fr = geo.frame.cpu().numpy().astype(np.int64)  # (N_V,)
    sx = np.array([s[0] for s in scales])[fr]
    sy = np.array([s[1] for s in scales])[fr]
    fx = np.array(frame_x)[fr]
    fy = np.array(frame_y)[fr]
    fw = np.array([w for w, _ in whs])[fr]
    fh = np.array([h for _, h in whs])[fr]
    finite = np.isfinite(box).all(axis=1)
    box = np.where(finite[:, None], box, 0.0)
    x0 = np.clip(np.floor(box[:, 0] * sx + 0.5), 0, fw)
    x1 = np.clip(np.floor(box[:, 2] * sx + 0.5), 0, fw)
    y0 = np.clip(np.floor(box[:, 1] * sy + 0.5), 0, fh)
    y1 = np.clip(np.floor(box[:, 3] * sy + 0.5), 0, fh)
    rects = np.stack([x0 + fx, y0 + fy, x1 + fx, y1 + fy], axis=1).astype(np.int32)  # (N_V, 4) picture px
    kinds = np.array([k in NO_BOX_KINDS for k in geo.kind], dtype=bool)
    has_box = finite & ~kinds & (x1 > x0) & (y1 > y0)

    label = np.full((H, W), -1, dtype=np.int32)
    idx = np.flatnonzero(has_box)
    area = (rects[idx, 2] - rects[idx, 0]) * (rects[idx, 3] - rects[idx, 1])
    for i in idx[np.argsort(-area, kind="stable")]:  # largest first: the smallest box wins a pixel
        a, b, c, d = rects[i]
        label[b:d, a:c] = i

    edges = np.zeros((H, W), dtype=bool)  # a pixel whose right/lower neighbour is another token
    diff_x = label[:, 1:] != label[:, :-1]
    diff_y = label[1:, :] != label[:-1, :]
    edges[:, :-1] |= diff_x
    edges[:-1, :] |= diff_y
    edges &= label >= 0
    dimmed = base.copy()
    dimmed[inside] = (base[inside].astype(np.float32) * dim).astype(np.uint8)
    if grid_alpha > 0:
        g = np.asarray(grid_color, dtype=np.float32)
        for arr in (base, dimmed):
            arr[edges] = (arr[edges] * (1 - grid_alpha) + g * grid_alpha).astype(np.uint8)
    return Layout(base=base, dimmed=dimmed, label=label, edges=edges, rects=rects, has_box=has_box,
                  frame_x=frame_x, frame_y=frame_y, frame_wh=whs, scales=scales)


def _place(whs: list[tuple[int, int]], columns: int, gap: int) -> tuple[list[int], list[int]]:
    """Offsets (x, y) of frames of sizes `whs` in rows of `columns`: a column as wide as its widest
    frame, a row as tall as its tallest."""
    columns = max(1, min(columns, len(whs)))
    col_w = [max(w for w, _ in whs[c::columns]) for c in range(columns)]
    row_h = [max(h for _, h in whs[r:r + columns]) for r in range(0, len(whs), columns)]
    col_x = [sum(col_w[:c]) + c * gap for c in range(columns)]
    row_y = [sum(row_h[:r]) + r * gap for r in range(len(row_h))]
    return [col_x[f % columns] for f in range(len(whs))], [row_y[f // columns] for f in range(len(whs))]


__all__ = ["BACKGROUND", "NO_BOX_KINDS", "Layout", "build_layout"]
