"""Where every InternVL visual token comes from, and the InternViT attention pooled to those tokens.

Views (the rows of `pixel_values`, as transformers' `InternVLProcessor` stacks them):
  image         `crop_to_patches`: the image stretched to a canvas of c x r tiles of S x S px (the grid
                `get_optimal_tiled_canvas` picks between min_patches and max_patches tiles), cut row by
                row, then, when there is more than one tile, the thumbnail (the whole image at S x S);
  video         one view per frame (the frame stretched to the video processor's size).
Each view: g x g patches (g = S / patch) plus InternViT's [CLS] in front; the pixel shuffle (ratio
0.5) turns each 2 x 2 patch block into one token, h x h = (g/2)^2 tokens per view (`image_seq_length`).
Which patches feed which token is read off the model's own `pixel_shuffle` run on patch indices.

Geometry: one image gives frame 2k = its tile canvas (kind "tile", grid (r h) x (c h): a token's row
and column on the whole canvas) and frame 2k+1 = the thumbnail (kind "thumbnail", h x h) when there
is one; a single-tile image has one frame. Video: frame f (kind "frame", h x h). Boxes are over the
ORIGINAL image or frame: the union of a token's patches, mapped back through the stretch.
"""
from __future__ import annotations

import torch

from ..common.clip_attention import capture_block
from ..common.patch_layout import Layout, owned, token_attention


def tile_grid(image_processor, size_hw, tiled: bool) -> tuple[int, int]:
    """(columns, rows) of tiles for an image of (H, W), as the GotOcr2 image processor chooses them."""
    from transformers.models.got_ocr2.image_processing_pil_got_ocr2 import get_optimal_tiled_canvas

    ip = image_processor
    if not tiled or int(ip.max_patches) <= 1:
        return 1, 1
    s = tile_size(ip)
    return get_optimal_tiled_canvas((int(size_hw[0]), int(size_hw[1])), s, int(ip.min_patches), int(ip.max_patches))


def tile_size(image_processor) -> tuple[int, int]:
    size = image_processor.size
    h = size["height"] if isinstance(size, dict) else size.height
    w = size["width"] if isinstance(size, dict) else size.width
    return int(h), int(w)


def shuffle_owner(model, g: int) -> torch.Tensor:
    """(h*h, k) the patch indices (row * g + col) behind each token of one view, from the model's own
    `pixel_shuffle` on an index grid (k = 1 / ratio^2 patches per token)."""
    idx = torch.arange(g * g, dtype=torch.float64).view(1, g, g, 1)
    out = model.model.pixel_shuffle(idx, scale_factor=model.config.downsample_ratio)  # (1, h, h, k)
    return out.reshape(-1, out.shape[-1]).round().long()


def _patch_boxes(g: int, patch_hw: tuple[float, float]) -> torch.Tensor:
    """(g*g, 4) float64 pixel boxes of a view's patches in its own S x S pixels."""
    r, c = torch.meshgrid(torch.arange(g), torch.arange(g), indexing="ij")
    r, c = r.flatten().double(), c.flatten().double()
    ph, pw = patch_hw
    return torch.stack([c * pw, r * ph, (c + 1) * pw, (r + 1) * ph], -1)


def add_view(lay: Layout, view: int, kind: str, frame: int, owner: torch.Tensor, g: int, patch_hw,
             to_original: torch.Tensor, row0: int = 0, col0: int = 0) -> None:
    """One view's h x h tokens: kind/frame, grid position (offset by row0/col0 on a tile canvas),
    patch ownership and boxes. to_original: (4,) x0, y0 offsets and x, y scales as (ox, oy, sx, sy)."""
    h = int(round(owner.shape[0] ** 0.5))
    i, j = torch.meshgrid(torch.arange(h), torch.arange(h), indexing="ij")
    t0 = lay.add(kind, torch.full((h * h,), frame), i.flatten() + row0, j.flatten() + col0)
    ox, oy, sx, sy = (float(v) for v in to_original)
    box = (_patch_boxes(g, patch_hw) + torch.tensor([ox, oy, ox, oy], dtype=torch.float64)) \
        * torch.tensor([sx, sy, sx, sy], dtype=torch.float64)
    tok = (t0 + torch.arange(owner.shape[0])).repeat_interleave(owner.shape[1])
    pos = owner.flatten()
    lay.own(view, pos, tok, box[pos])


def image_views(lay: Layout, view0: int, frame0: int, owner, g: int, size_wh, grid_cr, tile_hw) -> tuple[int, int]:
    """One image's tiles (+ thumbnail): adds its tokens; returns (views used, frames used)."""
    W, H = size_wh
    cols, rows = grid_cr
    S_h, S_w = tile_hw
    patch = (S_h / g, S_w / g)
    h = int(round(owner.shape[0] ** 0.5))
    sx, sy = W / (cols * S_w), H / (rows * S_h)  # canvas px -> original px
    for t in range(rows * cols):
        r, c = divmod(t, cols)
        add_view(lay, view0 + t, "tile", frame0, owner, g, patch, (c * S_w, r * S_h, sx, sy), r * h, c * h)
    lay.grids.append((rows * h, cols * h))
    lay.sizes.append((W, H))
    if rows * cols == 1:
        return 1, 1
    add_view(lay, view0 + rows * cols, "thumbnail", frame0 + 1, owner, g, patch, (0, 0, W / S_w, H / S_h))
    lay.grids.append((h, h))
    lay.sizes.append((W, H))
    return rows * cols + 1, 2


def video_views(lay: Layout, n_frames: int, owner, g: int, size_wh, frame_hw) -> None:
    W, H = size_wh
    S_h, S_w = frame_hw
    h = int(round(owner.shape[0] ** 0.5))
    for f in range(n_frames):
        add_view(lay, f, "frame", f, owner, g, (S_h / g, S_w / g), (0, 0, W / S_w, H / S_h))
        lay.grids.append((h, h))
        lay.sizes.append((W, H))


def capture(tower, layer_index: int, heads: bool = False):
    """Head-averaged attention probabilities (B, N+1, N+1) and keys (B, N+1, d_head), float32, of one
    InternViT block (`encoder.layer[i].attention`; keys after its `k_norm`), by the CLIP towers' hooks
    (`common.clip_attention.capture_block`; heads: the per-head maps too), removed on exit. Needs the tower in
    eager attention."""
    attn = tower.encoder.layer[layer_index].attention
    return capture_block(attn, attn.k_norm, heads=heads)


def cls_attention(lay: Layout, att: torch.Tensor, keys: torch.Tensor):
    """Per-view attention (views, n+1, n+1) and keys ([CLS] first) -> (N_V+1, N_V+1) with [CLS] first
    and keys (N_V+1, d_head). Row 0: the attention each token's patches receive from their view's
    [CLS] (summed over the token's patches); column 0: the mean attention its patches pay their [CLS];
    (0, 0) and key 0: view 0's [CLS]. The token block is `token_attention` (pooled, 0 across views)."""
    n, dev = len(lay.kind), att.device
    inner, k_tok = token_attention(lay, att, keys, offset=1)
    out = torch.zeros(n + 1, n + 1, dtype=att.dtype, device=dev)
    out[1:, 1:] = inner
    row = torch.zeros(n, dtype=att.dtype, device=dev)
    col = torch.zeros(n, dtype=att.dtype, device=dev)
    count = torch.zeros(n, dtype=att.dtype, device=dev)
    for v, pos, tok in owned(lay, dev):
        row.index_add_(0, tok, att[v, 0, pos + 1])
        col.index_add_(0, tok, att[v, pos + 1, 0])
        count.index_add_(0, tok, torch.ones_like(tok, dtype=att.dtype))
    out[0, 1:] = row
    out[1:, 0] = col / count.clamp_min(1)
    out[0, 0] = att[0, 0, 0]
    return out, torch.cat([keys[0, :1], k_tok])
