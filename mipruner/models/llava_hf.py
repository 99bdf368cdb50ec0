"""LLaVA-1.5 (transformers `LlavaForConditionalGeneration`, model_type "llava").

One image -> the CLIP tower's patch grid at `vision_feature_layer` (CLS dropped under the
"default" strategy) -> projector -> N_V = (H/p) x (W/p) tokens of the processed image, row-major.
Geometry undoes the processor's pad-to-square / shortest-edge resize / center crop, so every box
is in the ORIGINAL image's pixels; parts cut off by the center crop have no token, and tokens that
fall in the padding of a padded image get empty (zero-area) boxes.

Shared machinery (splicing, positions, generation, attention capture): `_llava_common`.
"""
from __future__ import annotations

import contextlib

import torch

from . import _llava_common as C


class LlavaAdapter(C.LlavaFamilyAdapter):
    family = "llava"
    model_class_name = "LlavaForConditionalGeneration"

    def _encode_visual(self, media, templated: str, need_attention: bool) -> dict:
        image = C.single_image(media, "LLaVA-1.5")
        inputs = self.processor(images=image, text=templated, return_tensors="pt")
        pixels = inputs["pixel_values"].to(self.device, self.dtype)  # (1, 3, Hp, Wp)
        extra = {"image_sizes": inputs["image_sizes"]} if "image_sizes" in inputs else {}
        tower = self.model.model.vision_tower
        n_layers = len(C.encoder_layers(tower))
        layer = C.feature_layer_index(self.config.vision_feature_layer, n_layers)
        ctx = C.capture_attention(tower, layer) if need_attention else contextlib.nullcontext()
        with ctx as cap:
            feats = self.model.get_image_features(pixel_values=pixels, return_dict=True, **extra).pooler_output
        visual = torch.cat(list(feats), dim=0)  # (N_V, d)
        geometry, has_cls = image_geometry(self, image, pixels.shape[-2:], visual.shape[0])
        out = dict(input_ids=inputs["input_ids"], visual=visual, geometry=geometry, frames=[image],
                   ref={k: v for k, v in inputs.items()})
        if need_attention:
            out.update(attention=cap["attention"][0].cpu(), keys=cap["keys"][0].cpu(), has_cls=True)
        return out


def image_geometry(adapter, image, processed_hw, n_visual: int, frame: int = 0):
    """Geometry of one CLIP-grid image (LLaVA-1.5, Video-LLaVA): (TokenGeometry, has CLS token)."""
    patch = int(adapter.config.vision_config.patch_size)
    hp, wp = int(processed_hw[0]), int(processed_hw[1])
    rows, cols = hp // patch, wp // patch
    pmap = C.resize_crop_map(image.width, image.height, adapter.image_processor)
    parts = []
    has_cls = n_visual == rows * cols + 1  # "full" strategy keeps CLS in front
    if not has_cls and n_visual != rows * cols:
        raise RuntimeError(f"{n_visual} visual tokens for a {rows} x {cols} patch grid")
    if has_cls:
        parts.append(cls_token(pmap, hp, wp, frame))
    parts.append(C.grid_geometry(pmap, rows, cols, patch, frame=frame))
    return C.cat_geometry(parts, [(rows, cols)], [image.size]), has_cls


def cls_token(pmap, hp: int, wp: int, frame: int) -> dict:
    """The [CLS] token: row = col = -1, box = the part of the original the processed image shows."""
    return dict(frame=torch.tensor([frame]), row=torch.tensor([-1]), col=torch.tensor([-1]),
                box=pmap.boxes([0.0], [0.0], [float(wp)], [float(hp)]), kind=["cls"])
