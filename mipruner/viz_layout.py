"""The per-encoding picture that every render of `mipruner.viz` reuses (`Layout`, `build_layout`):
the strip of frames, its dimmed copy, the label map of which visual token covers each pixel, and
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
    frame_x: per frame its x offset in the strip; scales: per frame (sx, sy) strip px per original px.
    """

    base: np.ndarray
    dimmed: np.ndarray
    label: np.ndarray
    edges: np.ndarray
    rects: np.ndarray
    has_box: np.ndarray
    frame_x: list[int]
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

    def crop(self, arr: np.ndarray, frame: int | None) -> np.ndarray:
        """`arr` (H, W, ...) cut to one frame's region, or whole when frame is None."""
        if frame is None:
            return arr
        if not 0 <= frame < len(self.frame_x):
            raise ValueError(f"frame must be in [0, {len(self.frame_x) - 1}], got {frame}")
        x, (w, h) = self.frame_x[frame], self.frame_wh[frame]
        return arr[:h, x:x + w]

    def locate(self, x: float, y: float) -> tuple[int, float, float] | None:
        """A strip pixel -> (frame, x, y) in that frame's original coordinates, or None (gap)."""
        for f, (fx, (w, h), (sx, sy)) in enumerate(zip(self.frame_x, self.frame_wh, self.scales)):
            if fx <= x < fx + w and 0 <= y < h:
                return f, (x - fx) / sx, y / sy
        return None


def build_layout(encoded, *, max_side: int = 768, gap: int = 4, dim: float = 0.3,
                 grid_color: tuple[int, int, int] = (255, 255, 255), grid_alpha: float = 0.25) -> Layout:
    """The per-encoding picture: strip, dimmed strip, label map and grid edges (see `Layout`).

    max_side: frames whose longer side exceeds it are downscaled for display; dim: brightness
    factor of dropped patches; grid_alpha: opacity of the token-grid outline (0 = none).
    """
    geo = encoded.geometry
    n_frames = len(geo.sizes)
    if len(encoded.frames) < n_frames:
        raise ValueError(f"encoding has {len(encoded.frames)} frames but geometry names {n_frames}")
    scales, whs = [], []
    for w, h in geo.sizes:
        s = min(1.0, max_side / max(w, h))
        sw, sh = max(1, round(w * s)), max(1, round(h * s))
        scales.append((sw / w, sh / h))
        whs.append((sw, sh))
    frame_x = [0]
    for w, _ in whs[:-1]:
        frame_x.append(frame_x[-1] + w + gap)
    W, H = frame_x[-1] + whs[-1][0], max(h for _, h in whs)
    base = np.empty((H, W, 3), dtype=np.uint8)
    base[:] = BACKGROUND
    inside = np.zeros((H, W), dtype=bool)
    for f in range(n_frames):
        im = encoded.frames[f].convert("RGB")
        if im.size != whs[f]:
            im = im.resize(whs[f], Image.BILINEAR)
        x, (w, h) = frame_x[f], whs[f]
        base[:h, x:x + w] = np.asarray(im)
        inside[:h, x:x + w] = True

    # token boxes -> strip rectangles (rounded the same way on both sides: neighbours share edges)
    box = geo.box.detach().to(torch.float64).cpu().numpy()  # (N_V, 4) original px
    fr = geo.frame.cpu().numpy().astype(np.int64)  # (N_V,)
    sx = np.array([s[0] for s in scales])[fr]
    sy = np.array([s[1] for s in scales])[fr]
    fx = np.array(frame_x)[fr]
    fw = np.array([w for w, _ in whs])[fr]
    fh = np.array([h for _, h in whs])[fr]
    finite = np.isfinite(box).all(axis=1)
    box = np.where(finite[:, None], box, 0.0)
    x0 = np.clip(np.floor(box[:, 0] * sx + 0.5), 0, fw)
    x1 = np.clip(np.floor(box[:, 2] * sx + 0.5), 0, fw)
    y0 = np.clip(np.floor(box[:, 1] * sy + 0.5), 0, fh)
    y1 = np.clip(np.floor(box[:, 3] * sy + 0.5), 0, fh)
    rects = np.stack([x0 + fx, y0, x1 + fx, y1], axis=1).astype(np.int32)  # (N_V, 4) strip px
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
                  frame_x=frame_x, frame_wh=whs, scales=scales)


__all__ = ["BACKGROUND", "NO_BOX_KINDS", "Layout", "build_layout"]
