"""LLaVA-1.5 (transformers `LlavaForConditionalGeneration`, model_type "llava").

Images, several images, and videos read as `default_frames` (8) frames sampled at i * n // 8 (fewer
when 8 images would not fit the LLM's context: `video_frames`, 6 for LLaVA-1.5-7B)
(transformers' `default_sample_indices_fn`, `mipruner.media.sample_indices`), each frame one image with its own <image> placeholder (LLaVA-1.5 has no video token; the embedded
shapes-llava answers about clips this way). Tokens are image after image; `frame` in the geometry
is the image's index. With several images the attention is one (N_V+1, N_V+1) matrix: row 0 is each
token's [CLS] attention within its own image, tokens of different images get 0.

One image -> the CLIP tower's patch grid at `vision_feature_layer` (CLS dropped under the
"default" strategy) -> projector -> N_V = (H/p) x (W/p) tokens of the processed image, row-major.
Geometry undoes the processor's pad-to-square / shortest-edge resize / center crop, so every box
is in the ORIGINAL image's pixels; parts cut off by the center crop have no token, and tokens that
fall in the padding of a padded image get empty (zero-area) boxes.

Shared machinery (splicing, positions, generation, attention capture): `common/hf_adapter.py`.
"""
from __future__ import annotations

from types import SimpleNamespace

import torch

from ...media import Video, load_media
from ...pruners.signals import Signals
from ..base import Abilities, LazyGeometry, TokenGeometry
from ..common import clip_attention as A
from ..common import hf_adapter as C
from . import short_tower as T
from . import geometry as G


TEXT_ROOM = 512  # positions a video's frames leave free for the prompt and the answer (at most 1/8 of the context)


class LlavaAdapter(C.ProcessorAdapter):
    family = "llava"
    # `generate_batch` (the decoding engine); `encode_batch`: the single images of a batch in one tower call
    abilities = Abilities(batch_decoding=True, batch_encoding=True)
    model_class_name = "LlavaForConditionalGeneration"
    default_frames = 8  # a video is read as this many evenly sampled frames, each one an image

    def _media(self, media):
        return load_media(media, num_frames=self.video_frames())

    def video_frames(self) -> int:
        """Frames read from a video file: `default_frames` (8), or as many whole images as fit the LLM's
        context with TEXT_ROOM positions (at most an eighth of it) left for the prompt and the answer (LLaVA-1.5-7B: 576 tokens an
        image, 4,096 positions: 6 frames; 8 would be 4,608 tokens)."""
        v = self.config.vision_config
        per_image = (int(v.image_size) // int(v.patch_size)) ** 2 + (self.config.vision_feature_select_strategy == "full")
        if not self.max_positions:
            return self.default_frames
        room = min(TEXT_ROOM, self.max_positions // 8)
        return max(1, min(self.default_frames, (self.max_positions - room) // per_image))

    def _template(self, prompt: str, kind: str, n_media: int = 1) -> str:
        """One <image> per image; a video's frames are `n_media` images (LLaVA has no video token)."""
        return super()._template(prompt, "image", n_media)

    def _encode_visual(self, media, templated: str, want, held=None) -> dict:
        if isinstance(media, Video):
            images, is_video = list(media.frames), True
        else:
            images, is_video = (list(media) if isinstance(media, list) else [media]), False
        if held is not None:  # this item's share of a batched tower call (`encode_batch`)
            inputs, outputs, rec = held
        else:  # pixels only: `encode` tokenizes the templated prompt once and expands its <image> placeholders
            inputs = self.image_processor(images, return_tensors="pt")
            outputs, rec = self._tower(inputs, want)
        pixels = inputs["pixel_values"]  # (F, 3, Hp, Wp)
        feats = outputs.pooler_output
        per_image = [f.shape[0] for f in feats]
        visual = torch.cat(list(feats), dim=0)  # (N_V, d): image after image
        hw = tuple(pixels.shape[-2:])
        has_cls = [cls_first(self, hw, n) for n in per_image][-1]  # checks every image's count now
        geometry = LazyGeometry(lambda: images_geometry(self, images, hw, per_image))  # built when read
        out = dict(placeholders=per_image, visual=visual, geometry=geometry, frames=images, is_video=is_video,
                   ref={"pixel_values": pixels})
        if want.features:  # the projector's input, (F, n, D_v): image after image, as the tokens
            out["features"] = rec.features().flatten(0, 1)  # (N_V, D_v)
        if want.attention:
            if len(images) == 1:
                def to_tokens(att, keys):  # (1, n+1, n+1), (1, n+1, d_head): the tower's own matrix
                    return att[0], keys[0]
            else:  # several images: one matrix over all tokens, each image's [CLS] row in row 0
                view = torch.cat([torch.full((n,), f, dtype=torch.long) for f, n in enumerate(per_image)])
                first = 0 if has_cls else 1  # the tokens' index within their image's tower sequence
                pos = torch.cat([torch.arange(first, first + n) for n in per_image])

                def to_tokens(att, keys):
                    return A.views_attention(att, keys, view, pos)
            att, keys = rec.finish(out, to_tokens)  # (F, n+1, n+1), (F, n+1, d_head) on the tower's device
            out["cls"] = A.projected_cls(self.model, outputs)  # (F, d): each image's [CLS], projected
            out.update(attention=att, keys=keys, has_cls=True)
        return out


    def _tower(self, inputs, want):
        """One vision-tower call on the processor's pixels (F images): (`get_image_features` outputs,
        the `common.signals.Record` of what `want` asks: the blocks' attention, the projector's input)."""
        pixels = inputs["pixel_values"].to(self.device, self.dtype)
        extra = {"image_sizes": inputs["image_sizes"]} if "image_sizes" in inputs else {}
        if self.decode_path.compile and not (want.attention or want.extra or extra):
            # nothing recorded: the tower runs compiled, as the packed prefill does (`DecodeEngine.compiled`:
            # CUDA graphs on CUDA, one per declared image count, others eager); outputs cloned out of the graph
            feats = self.decoder.compiled("tower", image_features, (int(pixels.shape[0]),))(self.model, pixels)
            return SimpleNamespace(pooler_output=[f.clone() for f in feats]), None
        tower = self.model.model.vision_tower
        with A.record(tower, want, self.config.vision_feature_layer, self.model.model.multi_modal_projector) as rec:
            if extra or not T.applies(self.model, tower):
                outputs = self.model.get_image_features(pixel_values=pixels, return_dict=True, **extra)
            else:  # the tower up to the block the projector reads (and any block recorded): `short_tower`
                upto = max(rec.asked.values(), default=-1) + 1
                outputs = T.image_features(self.model, tower, pixels, upto=upto)
        return outputs, rec

    @torch.no_grad()
    def encode_batch(self, items, *, text_mode: str = "question", need_attention: bool = False,
                     signals=None) -> list:
        """`encode` of several (media, prompt) items with ONE vision-tower call for those that are one
        image each (the processor gives every image the same fixed-size pixels); the rest are encoded
        one by one. Each item's processor run, prompt and outputs are its own: the encodings equal the
        one-by-one encodings up to float rounding of the batched tower (tests/models/test_encode_batch.py)."""
        loaded = [(self._media(m), p) for m, p in items]
        single = [i for i, (m, _) in enumerate(loaded) if not isinstance(m, Video) and
                  (not isinstance(m, list) or len(m) == 1)]
        held: dict = {}
        if len(single) > 1:
            inputs = []
            for i in single:
                m, p = loaded[i]
                C.check_prompt(p)
                image = m[0] if isinstance(m, list) else m
                inputs.append(self.image_processor([image], return_tensors="pt"))  # the prompt: tokenized by `encode`
            shapes = {tuple(x["pixel_values"].shape[1:]) for x in inputs}
            if len(shapes) == 1 and all("image_sizes" not in x for x in inputs):
                outputs, rec = self._tower({"pixel_values": torch.cat([x["pixel_values"] for x in inputs])},
                                           Signals.of(need_attention, signals))
                for j, (i, x) in enumerate(zip(single, inputs)):
                    held[i] = (x, _item_outputs(outputs, j), None if rec is None else rec.item(j))
        out = []
        return [self._encode(m, p, text_mode=text_mode, need_attention=need_attention, signals=signals, held=held.get(i))
                for i, (m, p) in enumerate(loaded)]


def image_features(model, pixels: torch.Tensor):
    """The projected visual tokens of a batch of images (`get_image_features`'s pooler output, the tower run
    up to the block the projector reads, `short_tower`): what the compiled tower computes."""
    tower = model.model.vision_tower
    if T.applies(model, tower):
        return T.image_features(model, tower, pixels).pooler_output
    return model.get_image_features(pixel_values=pixels, return_dict=True).pooler_output


def _item_outputs(outputs, j: int):
    """Image j's part of a batched `get_image_features` output (one image per item)."""
    kw = {"pooler_output": (outputs.pooler_output[j],)}
    for name in ("last_hidden_state",):
        v = getattr(outputs, name, None)
        if v is not None:
            kw[name] = v[j:j + 1]
    if getattr(outputs, "hidden_states", None) is not None:
        kw["hidden_states"] = tuple(None if h is None else h[j:j + 1] for h in outputs.hidden_states)
    return type(outputs)(**kw)


def cls_first(adapter, processed_hw, n_visual: int) -> bool:
    """Whether an image's `n_visual` tokens start with its [CLS] (the "full" strategy) on its patch grid;
    RuntimeError when the count fits neither."""
    patch = int(adapter.config.vision_config.patch_size)
    rows, cols = int(processed_hw[0]) // patch, int(processed_hw[1]) // patch
    if n_visual not in (rows * cols, rows * cols + 1):
        raise RuntimeError(f"{n_visual} visual tokens for a {rows} x {cols} patch grid")
    return n_visual == rows * cols + 1


def images_geometry(adapter, images, processed_hw, per_image) -> TokenGeometry:
    """The geometry of CLIP-grid images one after another (`per_image` tokens each), frame = the image's index."""
    parts, grids = [], []
    for f, (image, n) in enumerate(zip(images, per_image)):
        p, grid, _ = image_parts(adapter, image, processed_hw, n, frame=f)
        parts += p
        grids.append(grid)
    return G.cat_geometry(parts, grids, [im.size for im in images])


def image_parts(adapter, image, processed_hw, n_visual: int, frame: int = 0):
    """Geometry parts of one CLIP-grid image: (parts for `cat_geometry`, (rows, cols), has CLS token)."""
    patch = int(adapter.config.vision_config.patch_size)
    hp, wp = int(processed_hw[0]), int(processed_hw[1])
    rows, cols = hp // patch, wp // patch
    pmap = G.resize_crop_map(image.width, image.height, adapter.image_processor)
    parts = []
    has_cls = cls_first(adapter, processed_hw, n_visual)  # "full" strategy keeps CLS in front
    if has_cls:
        parts.append(cls_token(pmap, hp, wp, frame))
    parts.append(G.grid_geometry(pmap, rows, cols, patch, frame=frame))
    return parts, (rows, cols), has_cls


def image_geometry(adapter, image, processed_hw, n_visual: int, frame: int = 0):
    """Geometry of one CLIP-grid image (LLaVA-1.5, Video-LLaVA): (TokenGeometry, has CLS token)."""
    parts, grid, has_cls = image_parts(adapter, image, processed_hw, n_visual, frame)
    return G.cat_geometry(parts, [grid], [image.size]), has_cls


def cls_token(pmap, hp: int, wp: int, frame: int) -> dict:
    """The [CLS] token: row = col = -1, box = the part of the original the processed image shows."""
    return dict(frame=torch.tensor([frame]), row=torch.tensor([-1]), col=torch.tensor([-1]),
                box=pmap.boxes([0.0], [0.0], [float(wp)], [float(hp)]), kind=["cls"])
