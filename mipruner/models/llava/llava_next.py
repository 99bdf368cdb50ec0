"""LLaVA-NeXT (transformers `LlavaNextForConditionalGeneration`, model_type "llava_next").

"anyres": the image is seen twice. The base view (the whole image resized to one CLIP input)
gives a g x g grid; the high-resolution view resizes the image to the best of
`image_grid_pinpoints` (aspect preserved, centred padding), cuts it into CLIP-sized tiles, and
the model stitches the tiles' grids into one canvas, removes the padded rows/columns ("unpad")
and appends an `image_newline` token after every canvas row. LLM order: base tokens, then the
unpadded canvas row by row, each row followed by its newline token.

Geometry, as views of the same image: frame 0 = the base view (kind "base", grid g x g), frame 1
= the tile canvas (kind "tile", grid = the unpadded canvas); `Encoded.frames` holds the image
twice so that `frames[geometry.frame]` is always the picture to draw on. Newline tokens (kind
"newline", frame 1, col = canvas width) get the box of their row's extent. The token order is
obtained by running the model's own public `pack_image_features` on index tensors, so it follows
transformers' unpad/stitch code exactly rather than a re-implementation of it.

Attention (need_attention=True): the vision tower sees the base view and every tile, each with
its own [CLS]. `attention` is (N_V+1, N_V+1) over ALL visual tokens, [CLS] first: row 0 holds
each token's [CLS] attention within its own view; block (1+i, 1+j) the attention between tokens
of the same view (0 across views); newline tokens, which the tower never sees, get zeros. `keys`
is (N_V+1, d_head): the base view's [CLS] key, then each token's key in its view (newlines 0).
The raw per-view tensors are in `state.extra["attention_all"]` (views, n+1, n+1) / `state.extra["keys_all"]`.
"""
from __future__ import annotations

import numpy as np
import torch

from ..common import clip_attention as A
from ..common import hf_adapter as C
from .media import single_image
from . import geometry as G
from ..base import TokenGeometry


class LlavaNextAdapter(C.ProcessorAdapter):
    family = "llava_next"
    model_class_name = "LlavaNextForConditionalGeneration"

    def _encode_visual(self, media, templated: str, want, held=None) -> dict:
        image = single_image(media, "LLaVA-NeXT")
        inputs = self.image_processor(image, return_tensors="pt")  # pixels: `encode` tokenizes the prompt, once
        pixels = inputs["pixel_values"].to(self.device, self.dtype)  # (1, views, 3, h, w)
        sizes = inputs["image_sizes"].to(self.device)  # (1, 2) = (H, W)
        tower = self.model.model.vision_tower
        with A.record(tower, want, self.config.vision_feature_layer, self.model.model.multi_modal_projector) as rec:
            outputs = self.model.get_image_features(pixel_values=pixels, image_sizes=sizes, return_dict=True)
        feats = outputs.pooler_output
        visual = torch.cat(list(feats), dim=0)  # (N_V, d): base, then canvas rows + newlines
        geometry, packed = self._geometry(image, pixels.shape[-2:], sizes)
        if len(geometry) != visual.shape[0]:
            raise RuntimeError(f"geometry has {len(geometry)} tokens, the model gave {visual.shape[0]}")
        out = dict(placeholders=[visual.shape[0]], visual=visual, geometry=geometry, frames=[image, image],
                   ref={k: v for k, v in inputs.items()})
        if want.features:  # the projector's input per view, (views, n, D_v), packed as the tokens are
            f = rec.features()
            zero = torch.zeros(f.shape[-1], dtype=f.dtype, device=f.device)  # newline rows: zeros
            packed_f, _ = self.model.model.pack_image_features([f], sizes, self.config.vision_feature_select_strategy,
                                                               image_newline=zero)
            out["features"] = packed_f[0] if isinstance(packed_f, (list, tuple)) else packed_f  # (N_V, D_v)
        if want.attention:
            cap = rec.cap
            att, keys = rec.finish(out, lambda a, k: self._token_attention(a, k, packed, pixels.shape[-1]))
            out.update(attention=att, keys=keys, has_cls=True, cls=A.projected_cls(self.model, outputs),  # (views, d)
                       state={"attention_all": cap["attention"].cpu(), "keys_all": cap["keys"].cpu()})
        return out

    def _token_attention(self, att_all, keys_all, packed, width_px):
        """Per-view attention (views, n+1, n+1) -> (N_V+1, N_V+1) over the visual tokens, CLS first."""
        g_c = int(width_px) // int(self.config.vision_config.patch_size)
        view, row, col = packed[:, 0], packed[:, 1], packed[:, 2]
        pos = torch.where(view >= 0, 1 + (row * g_c + col).clamp_min(0), torch.zeros((), dtype=torch.long))
        return A.views_attention(att_all, keys_all, view, pos)

    def _geometry(self, image, processed_hw, sizes):
        from transformers.image_processing_utils import get_patch_output_size, select_best_resolution

        cfg = self.config
        patch = int(cfg.vision_config.patch_size)
        hp, wp = int(processed_hw[0]), int(processed_hw[1])
        g_r, g_c = hp // patch, wp // patch  # token grid of one view
        W, H = image.size
        ip = self.image_processor
        # -- which (view, row, col) each visual token is: the model's own packing on index tensors
        bh, bw = select_best_resolution((H, W), ip.image_grid_pinpoints)  # canvas (pixels)
        tile_px = G._size_get(ip.crop_size, "height") or G._size_get(ip.size, "height") \
            or G._size_get(ip.size, "shortest_edge")
        n_tr, n_tc = bh // tile_px, bw // tile_px
        views = 1 + n_tr * n_tc  # base view + tiles, as the processor stacks them
        r, c = torch.meshgrid(torch.arange(g_r), torch.arange(g_c), indexing="ij")
        idx = torch.stack([torch.arange(views).view(-1, 1).expand(views, g_r * g_c).float(),
                           r.flatten().float().expand(views, -1), c.flatten().float().expand(views, -1)],
                          dim=-1).to(torch.float64)  # (views, g*g, 3): (view, row, col)
        marker = torch.full((3,), -1.0, dtype=torch.float64)
        packed, _ = self.model.model.pack_image_features([idx], sizes.cpu(), cfg.vision_feature_select_strategy,
                                                         image_newline=marker)
        packed = packed[0].round().long()  # (N_V, 3)
        view, row, col = packed[:, 0], packed[:, 1], packed[:, 2]
        newline = view < 0
        base = view == 0
        tile = ~newline & ~base
        # -- base view: original stretched to the base size, then the processor's resize/crop
        sw = G._size_get(ip.size, "width") or G._size_get(ip.size, "shortest_edge")
        sh = G._size_get(ip.size, "height") or G._size_get(ip.size, "shortest_edge")
        bmap = G.resize_crop_map(sw, sh, ip)
        box = torch.zeros(len(packed), 4)
        br, bc = row[base], col[base]
        b = bmap.boxes(bc * patch, br * patch, (bc + 1) * patch, (br + 1) * patch)  # in the (sw, sh) image
        box[base] = b * torch.tensor([W / sw, H / sh, W / sw, H / sh])
        # -- tiles: tile pixel -> canvas pixel -> original (undo resize-to-fit + centred padding)
        tmap = G.resize_crop_map(tile_px, tile_px, ip)
        dummy = np.broadcast_to(np.zeros((1, 1, 1), np.uint8), (3, H, W))
        new_h, new_w = get_patch_output_size(dummy, (bh, bw), input_data_format="channels_first")
        paste_x, paste_y = (bw - new_w) // 2, (bh - new_h) // 2
        ti, tj = (view[tile] - 1) // n_tc, (view[tile] - 1) % n_tc  # tile grid position (row-major)
        tr, tc = row[tile], col[tile]
        t = tmap.boxes(tc * patch, tr * patch, (tc + 1) * patch, (tr + 1) * patch)  # in tile pixels
        off = torch.stack([tj * tile_px, ti * tile_px, tj * tile_px, ti * tile_px], dim=-1).float()
        t = t + off - torch.tensor([paste_x, paste_y, paste_x, paste_y], dtype=torch.float32)
        t = t * torch.tensor([W / new_w, H / new_h, W / new_w, H / new_h])
        box[tile] = torch.stack([t[:, 0].clamp(0, W), t[:, 1].clamp(0, H), t[:, 2].clamp(0, W),
                                 t[:, 3].clamp(0, H)], dim=-1)
        # canvas row/col, then shifted to the unpadded canvas (transformers' `unpad_image` gives its
        # size; an extreme aspect ratio can leave it with no rows or no columns)
        from transformers.models.llava_next.modeling_llava_next import unpad_image
        rows_u, cols_u = unpad_image(torch.zeros(1, n_tr * g_r, n_tc * g_c), (H, W)).shape[1:]
        cr, cc = ti * g_r + tr, tj * g_c + tc
        r0 = int(cr.min()) if len(cr) else 0  # no tile token: only columns were cut, rows start at 0
        cr, cc = cr - r0, cc - (int(cc.min()) if len(cc) else 0)
        R, Cc = torch.full((len(packed),), -1), torch.full((len(packed),), -1)
        R[base], Cc[base] = br, bc
        R[tile], Cc[tile] = cr, cc
        frame = torch.where(base, 0, 1)
        # newline k closes canvas row k: its row's extent (zero-width at the centre for an empty row)
        nl = torch.nonzero(newline).flatten()
        R[nl] = torch.arange(len(nl))
        Cc[nl] = cols_u
        for k, i in enumerate(nl.tolist()):
            in_row = tile & (R == k)
            if bool(in_row.any()):
                box[i] = torch.cat([box[in_row, :2].min(0).values, box[in_row, 2:].max(0).values])
            else:
                a, t_r = divmod(k + r0, g_r)
                y = tmap.boxes([0.0], [float(t_r * patch)], [0.0], [float((t_r + 1) * patch)])[0, 1::2]
                y = ((y + a * tile_px - paste_y) * H / new_h).clamp(0, H)
                box[i] = torch.tensor([W / 2, float(y[0]), W / 2, float(y[1])])
        kind = ["newline" if n else ("base" if b_ else "tile") for n, b_ in zip(newline.tolist(), base.tolist())]
        geo = TokenGeometry(frame=frame.long(), row=R.long(), col=Cc.long(), box=box, kind=kind,
                              grids=[(g_r, g_c), (int(rows_u), int(cols_u))], sizes=[(W, H), (W, H)])
        return geo, packed  # packed (N_V, 3): (view, row, col) in the view's grid; -1s for newlines
