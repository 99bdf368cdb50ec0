"""Where each LLaVA-family visual token comes from: the map from processed pixels back to the
original image (resize + centre crop), per-grid token boxes, and their concatenation over views."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..base import TokenGeometry


def _size_get(size, key):
    if size is None:
        return None
    if isinstance(size, dict):
        return size.get(key)
    return getattr(size, key, None)


@dataclass
class PixelMap:
    """x_orig = (x_proc + crop_x) / scale_x - pad_x (same for y): undoes pad -> resize -> crop."""

    width: int  # original
    height: int
    pad_x: float = 0.0
    pad_y: float = 0.0
    scale_x: float = 1.0
    scale_y: float = 1.0
    crop_x: float = 0.0
    crop_y: float = 0.0

    def boxes(self, x0, y0, x1, y1) -> torch.Tensor:
        """(N, 4) original-pixel boxes of processed-pixel boxes, clipped to the image."""
        bx = (torch.as_tensor(x0, dtype=torch.float64), torch.as_tensor(x1, dtype=torch.float64))
        by = (torch.as_tensor(y0, dtype=torch.float64), torch.as_tensor(y1, dtype=torch.float64))
        xs = [((x + self.crop_x) / self.scale_x - self.pad_x).clamp(0, self.width) for x in bx]
        ys = [((y + self.crop_y) / self.scale_y - self.pad_y).clamp(0, self.height) for y in by]
        return torch.stack([xs[0], ys[0], xs[1], ys[1]], dim=-1).to(torch.float32)


def resize_crop_map(width: int, height: int, ip) -> PixelMap:
    """How a LLaVA-style image processor (pad-to-square? -> resize -> center crop?) moved pixels.

    Reads `do_pad`, `do_resize`, `size` (shortest_edge or height/width), `do_center_crop`,
    `crop_size` from the processor; the sizes are computed with transformers' own
    `get_resize_output_image_size`, so rounding matches the processor.
    """
    from transformers.image_transforms import get_resize_output_image_size

    m = PixelMap(width, height)
    w, h = width, height
    if getattr(ip, "do_pad", False) and getattr(ip, "pad_to_square", None) is not None and w != h:
        side = max(w, h)  # pad_to_square centres the image: start = (side - edge) // 2
        m.pad_x, m.pad_y = float((side - w) // 2), float((side - h) // 2)
        w = h = side
    if getattr(ip, "do_resize", True):
        size = ip.size
        short = _size_get(size, "shortest_edge")
        if short:
            dummy = np.broadcast_to(np.zeros((1, 1, 1), np.uint8), (3, h, w))  # no memory
            new_h, new_w = get_resize_output_image_size(dummy, size=short, default_to_square=False,
                                                        input_data_format="channels_first")
        else:
            new_h, new_w = _size_get(size, "height"), _size_get(size, "width")
        m.scale_x, m.scale_y = new_w / w, new_h / h
        w, h = new_w, new_h
    if getattr(ip, "do_center_crop", False):
        ch, cw = _size_get(ip.crop_size, "height"), _size_get(ip.crop_size, "width")
        # transformers' center_crop: top = (h - ch) // 2 when cropping, else pads by ceil((ch - h) / 2)
        m.crop_y = float((h - ch) // 2) if h >= ch else -float(-(-(ch - h) // 2))
        m.crop_x = float((w - cw) // 2) if w >= cw else -float(-(-(cw - w) // 2))
    return m


def grid_geometry(pmap: PixelMap, rows: int, cols: int, patch: int, frame: int = 0, kind: str = "patch"):
    """frame/row/col/box/kind for a rows x cols patch grid of `patch`-pixel processed patches."""
    r, c = torch.meshgrid(torch.arange(rows), torch.arange(cols), indexing="ij")
    r, c = r.flatten(), c.flatten()  # row-major, the order the vision tower emits them
    box = pmap.boxes(c * patch, r * patch, (c + 1) * patch, (r + 1) * patch)  # (rows*cols, 4)
    return dict(frame=torch.full_like(r, frame), row=r, col=c, box=box, kind=[kind] * len(r))


def cat_geometry(parts: list[dict], grids, sizes) -> TokenGeometry:
    """One TokenGeometry from per-view parts (tiles, images, frames), in the LLM's input order."""
    return TokenGeometry(frame=torch.cat([p["frame"] for p in parts]).long(),
                         row=torch.cat([p["row"] for p in parts]).long(),
                         col=torch.cat([p["col"] for p in parts]).long(),
                         box=torch.cat([p["box"] for p in parts]).float(),
                         kind=[k for p in parts for k in p["kind"]], grids=list(grids), sizes=list(sizes))


# ----------------------------------------------------------------------------------------------
# vision-encoder attention capture
