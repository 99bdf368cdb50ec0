"""Where every LLaVA-OneVision visual token comes from: for each vision-tower patch (view, position)
the visual token it feeds (its "owner") and its pixel box in the original image; from these the
tokens' geometry (boxes = the union of their patches), and the tower's attention and keys pooled to
tokens (`token_attention`, in the shared `common/patch_layout.py`). Also the video frames as transformers'
video processor prepares them.

Token order, as `LlavaOnevisionModel.get_image_features` / `get_video_features` build it:
  one image      base view (g x g), then the unpadded tile canvas row by row, each row followed by
                 an `image_newline` token; the canvas bilinearly shrunk to (h', w') when larger than
                 `vision_aspect_ratio` allows ("anyres_max_9": ratio sqrt(rows*cols / (9 g^2)) > 1.1);
  several images each: its base view of the image padded to a square (g x g), then one newline;
  video          each frame's g x g grid bilinearly pooled to ceil(g/2) x ceil(g/2), frame by frame,
                 then ONE newline token for the whole video.
Sizes (h', w', which canvas cells survive unpadding) come from running transformers' own
`unpad_image` / `pack_image_features` on index tensors. A pooled token owns the patches whose
centres fall in its cell (the bilinear shrink reads its neighbours too: the owner is the patch set
it mostly averages; for an exact 2x shrink it is exactly the 2x2 block).
"""
from __future__ import annotations

import math

import numpy as np
import torch

from ..common.patch_layout import Layout


def _cells(n_in: int, n_out: int) -> torch.Tensor:
    """(n_in,) the output cell of each input index when n_in cells shrink to n_out."""
    return ((torch.arange(n_in, dtype=torch.float64) + 0.5) * n_out / n_in).floor().long().clamp_max(n_out - 1)


def _patch_boxes(rows: torch.Tensor, cols: torch.Tensor, patch: int) -> torch.Tensor:
    return torch.stack([cols * patch, rows * patch, (cols + 1) * patch, (rows + 1) * patch], -1).double()


def _grid(g: int):
    r, c = torch.meshgrid(torch.arange(g), torch.arange(g), indexing="ij")
    return r.flatten(), c.flatten()


def _newline_box(lay: Layout, token: int, members: torch.Tensor) -> None:
    """A newline's box: the extent of the patches owned by `members` (bool over tokens so far)."""
    own = lay.owner.flatten()
    sel = (own >= 0) & members[own.clamp_min(0)]
    b = lay.pbox.view(-1, 4)[sel]
    if b.numel():
        lay.fixed[token] = torch.cat([b[:, :2].min(0).values, b[:, 2:].max(0).values])


def anyres_image(lay: Layout, model, image_size_hw, g: int, patch: int, frame0: int = 0) -> None:
    """One image in anyres mode: base view (view 0) + tiles (views 1..), unpadded (and shrunk) canvas."""
    from transformers.image_processing_utils import get_patch_output_size, select_best_resolution
    from transformers.models.llava_onevision.modeling_llava_onevision import unpad_image

    H, W = int(image_size_hw[0]), int(image_size_hw[1])
    tile_px = g * patch
    r, c = _grid(g)
    # base view: the whole image stretched to the tower's input
    t0 = lay.add("base", torch.full_like(r, frame0), r, c)
    lay.own(0, r * g + c, t0 + r * g + c, _patch_boxes(r, c, patch) * torch.tensor([W, H, W, H]) / tile_px)
    # canvas: resized to fit the best resolution, centred, padded, cut into tiles
    bh, bw = select_best_resolution((H, W), model.config.image_grid_pinpoints)
    n_tr, n_tc = bh // tile_px, bw // tile_px
    dummy = np.broadcast_to(np.zeros((1, 1, 1), np.uint8), (3, H, W))
    new_h, new_w = get_patch_output_size(dummy, (bh, bw), input_data_format="channels_first")
    paste_x, paste_y = (bw - new_w) // 2, (bh - new_h) // 2
    R, C = n_tr * g, n_tc * g
    kept = unpad_image(torch.arange(R * C, dtype=torch.float64).view(1, R, C), (H, W))[0].round().long()
    ru, cu = kept.shape
    # h', w' as the model computes them: pack an all-zero canvas with a marker newline
    feats = torch.zeros(1 + n_tr * n_tc, g * g, 1)
    marker = torch.ones(1)
    packed, _ = model.model.pack_image_features([feats], torch.tensor([[H, W]]), image_newline=marker,
                                                vision_aspect_ratio=model.config.vision_aspect_ratio)
    body = packed[0][g * g:, 0]
    hp = int(body.sum())  # newline count = rows
    wp = (int(body.numel()) - hp) // max(hp, 1)
    lay.grids += [(g, g), (hp, wp)]
    lay.sizes += [(W, H), (W, H)]
    kinds_start = len(lay.kind)
    for i in range(hp):  # rows of the canvas: wp tile tokens then a newline
        lay.add("tile", torch.full((wp,), frame0 + 1), torch.full((wp,), i), torch.arange(wp))
        lay.add("newline", torch.full((1,), frame0 + 1), torch.full((1,), i), torch.full((1,), wp))
    # ownership: unpadded canvas cell (a, b) -> shrunk cell -> token
    a, b = torch.meshgrid(torch.arange(ru), torch.arange(cu), indexing="ij")
    ia, jb = _cells(ru, hp)[a.flatten()], _cells(cu, wp)[b.flatten()]
    token = kinds_start + ia * (wp + 1) + jb
    absolute = kept.flatten()  # index in the full canvas
    cr, cc = absolute // C, absolute % C
    view = 1 + (cr // g) * n_tc + (cc // g)
    pos = (cr % g) * g + (cc % g)
    px = _patch_boxes(cr, cc, patch) - torch.tensor([paste_x, paste_y, paste_x, paste_y], dtype=torch.float64)
    px = px * torch.tensor([W / new_w, H / new_h, W / new_w, H / new_h], dtype=torch.float64)
    px = torch.stack([px[:, 0].clamp(0, W), px[:, 1].clamp(0, H), px[:, 2].clamp(0, W), px[:, 3].clamp(0, H)], -1)
    lay.own(view, pos, token, px)
    is_tile = torch.tensor([k == "tile" for k in lay.kind])
    row_of = torch.cat(lay.row)
    for i in range(hp):
        _newline_box(lay, kinds_start + i * (wp + 1) + wp, is_tile & (row_of == i))


def base_view(lay: Layout, size_wh, g: int, patch: int) -> None:
    """One image read as its base view only (`views="base"`): the image stretched to the tower's input (view 0,
    g x g, as anyres's first view), then one newline (box: the whole image), as the model packs a one-view image."""
    W, H = size_wh
    r, c = _grid(g)
    t0 = lay.add("base", torch.zeros_like(r), r, c)
    lay.own(0, r * g + c, t0 + r * g + c, _patch_boxes(r, c, patch) * torch.tensor([W, H, W, H]) / (g * patch))
    nl = lay.add("newline", torch.zeros(1, dtype=torch.long), torch.full((1,), g), torch.full((1,), g))
    lay.fixed[nl] = torch.tensor([0.0, 0.0, W, H], dtype=torch.float64)
    lay.grids.append((g, g))
    lay.sizes.append((W, H))


def square_image(lay: Layout, view: int, frame: int, size_wh, g: int, patch: int) -> None:
    """One image of several: its base view of the image padded to a square, then one newline."""
    W, H = size_wh
    side = max(W, H)
    off = torch.tensor([(side - W) // 2, (side - H) // 2] * 2, dtype=torch.float64)
    r, c = _grid(g)
    t0 = lay.add("base", torch.full_like(r, frame), r, c)
    px = _patch_boxes(r, c, patch) * side / (g * patch) - off
    px = torch.stack([px[:, 0].clamp(0, W), px[:, 1].clamp(0, H), px[:, 2].clamp(0, W), px[:, 3].clamp(0, H)], -1)
    lay.own(view, r * g + c, t0 + r * g + c, px)
    nl = lay.add("newline", torch.full((1,), frame), torch.full((1,), g), torch.full((1,), g))
    lay.fixed[nl] = torch.tensor([0.0, 0.0, W, H], dtype=torch.float64)
    lay.grids.append((g, g))
    lay.sizes.append((W, H))


def video_frames(lay: Layout, n_frames: int, size_wh, g: int, patch: int) -> None:
    """F frames, each g x g pooled to ceil(g/2) squared, then one newline for the video."""
    W, H = size_wh
    h = math.ceil(g / 2)
    r, c = _grid(g)
    pr, pc = _grid(h)
    owner_cell = _cells(g, h)[r] * h + _cells(g, h)[c]
    px = _patch_boxes(r, c, patch) * torch.tensor([W, H, W, H], dtype=torch.float64) / (g * patch)
    for f in range(n_frames):
        t0 = lay.add("frame", torch.full_like(pr, f), pr, pc)
        lay.own(f, r * g + c, t0 + owner_cell, px)
        lay.grids.append((h, h))
        lay.sizes.append((W, H))
    nl = lay.add("newline", torch.full((1,), n_frames - 1), torch.full((1,), h), torch.full((1,), h))
    lay.fixed[nl] = torch.tensor([0.0, 0.0, W, H], dtype=torch.float64)
