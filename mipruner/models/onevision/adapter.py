"""LLaVA-OneVision (transformers `LlavaOnevisionForConditionalGeneration`, model_type "llava_onevision";
also the class of LLaVA-Video checkpoints): SigLIP + 2-layer MLP + Qwen2, one image, several images, video.

Tokens in LLM order and their geometry are described in `layout.py`. In short:
  one image     anyres_max_9: base view (kind "base", frame 0, g x g), then the unpadded tile canvas
                (kind "tile", frame 1, shrunk bilinearly when over 9 tiles' worth), each canvas row
                closed by a "newline" token (frame 1, col = canvas width, box = its row's extent).
                `Encoded.frames` holds the image twice so that frames[geometry.frame] is its picture.
  several images  each image's base view of the image padded to a square (kind "base", frame k),
                then one "newline" (box: the whole image), as the model reads multi-image prompts.
  video         per frame ceil(g/2) x ceil(g/2) tokens pooled bilinearly from the g x g grid (kind
                "frame", frame f), then one "newline" for the whole video (box: the last frame).
  views="base"  one image read as its base view only (`_encode_base`: g x g tokens, then one newline).
Boxes are over the ORIGINAL image or frame (base: stretched view; tiles: undo resize-to-fit and the
centred padding; several images: undo the pad to square; pooled tokens: the union of their patches).

Inputs: hub checkpoints name a video processor whose class needs torchvision, so `AutoProcessor`
cannot be built here. Images go through transformers' own `LlavaOnevisionProcessor.__call__` on an
instance built by its own constructor from the checkpoint's tokenizer, image processor and
processor_config.json (`_processor`, `common/video_slot.py`), so input ids, pixel values, image
sizes and `batch_num_images` are exactly the processor's. Videos: frames sampled as
transformers' `BaseVideoProcessor.sample_frames` (`frame_indices`: the checkpoint's num_frames or fps
when its video config samples, else `default_frames` = 8 by the same rule), each
resized to the video processor's size (PIL bicubic,
where transformers uses torchvision's bicubic: pixels differ by interpolation rounding), rescaled and
normalised with its settings; the <video> placeholder is expanded by the processor's own
`replace_video_token`.

Attention (need_attention=True). SigLIP has no [CLS], so, as for Qwen, `has_cls` is False, `cls` is
None and `attention` is (N_V, N_V): the tower's feature-layer attention (head mean) of each view
(base view, tile, padded image, frame), pooled to visual tokens (a token's row = the mean over its
patches of the attention summed over each other token's patches), 0 across views and for the
newline tokens, which the tower never sees; `keys` (N_V, d_head) the mean key of each token's patches.
So "attention" ranks tokens by the attention the other tokens of their view pay them (column sum),
VisionZip keeps dominant tokens by that score and merges the rest with no [CLS] prefix, VisPruner
takes that score for its important tokens and then its diversity step, MI-Attention uses it as its
prior; the in-LLM methods (FastV, DART, SparseVLM) read the decoder through `llm_inputs`.
"""
from __future__ import annotations

import torch

from ...media import MediaError, Video, sample_indices
from ..common import clip_attention as A
from ..common import hf_adapter as C
from . import layout as L
from ..common.hub_files import read_chat_template, read_json
from ..common.patch_layout import Layout, token_attention
from ..common.sampled_video import SampledVideo, frames_asked, video_pixels
from ..common.video_slot import build_processor

# LlavaOnevisionVideoProcessor's class defaults (transformers 5.x)
VIDEO_DEFAULTS = dict(size={"height": 384, "width": 384}, resample=3, do_rescale=True, rescale_factor=1 / 255,
                      do_normalize=True, image_mean=[0.48145466, 0.4578275, 0.40821073],
                      image_std=[0.26862954, 0.26130258, 0.27577711], do_sample_frames=False, num_frames=None,
                      fps=None)


def frame_indices(total: int, video_fps: float, s: dict, default: int) -> list[int]:
    """Which frames are read: with `do_sample_frames`, transformers' `default_sample_indices_fn` with the
    config's num_frames, or fps (max(1, int(total / video_fps * fps)) frames); every frame where it
    would refuse (more asked than there are). Without it, `default` frames by the same rule
    (transformers would read every frame, which overflows the context for any real clip)."""
    if s["do_sample_frames"] and s["num_frames"] is not None and s["fps"] is not None:
        raise MediaError("the video processor config sets both fps and num_frames; they are mutually exclusive")
    n = frames_asked(total, video_fps, s, default)
    return list(range(total)) if n is None else sample_indices(total, n)


def _processor(ip, tok, pcfg: dict, model_config, chat_template):
    """transformers' LlavaOnevisionProcessor built by its own constructor on the checkpoint's parts (its video slot:
    `common.video_slot.PreparedFrames`; the adapter expands video placeholders itself, `_encode_video`)."""
    from transformers import LlavaOnevisionProcessor

    g = int(model_config.vision_config.image_size) // int(model_config.vision_config.patch_size)
    return build_processor(
        LlavaOnevisionProcessor, image_processor=ip, tokenizer=tok, chat_template=chat_template,
        num_image_tokens=pcfg.get("num_image_tokens") or g * g,
        vision_feature_select_strategy=pcfg.get("vision_feature_select_strategy")
        or model_config.vision_feature_select_strategy,
        vision_aspect_ratio=pcfg.get("vision_aspect_ratio") or model_config.vision_aspect_ratio,
        image_token=pcfg.get("image_token", "<image>"), video_token=pcfg.get("video_token", "<video>"))


class LlavaOnevisionAdapter(SampledVideo, C.ProcessorAdapter):
    family = "llava_onevision"
    model_class_name = "LlavaOnevisionForConditionalGeneration"
    frame_rule = staticmethod(frame_indices)
    video_defaults = VIDEO_DEFAULTS
    view_modes = ("all", "base")

    @classmethod
    def _load_processor(cls, path: str):
        from transformers import AutoConfig, AutoImageProcessor, AutoTokenizer

        tok = AutoTokenizer.from_pretrained(path)
        ip = AutoImageProcessor.from_pretrained(path)
        proc = _processor(ip, tok, read_json(path, "processor_config.json"), AutoConfig.from_pretrained(path),
                          read_chat_template(path, tok))
        return proc, tok, ip

    def _template(self, prompt: str, kind: str, n_media: int = 1) -> str:
        return super()._template(prompt, kind, 1 if kind == "video" else n_media)

    # -- encode --------------------------------------------------------------------------------

    def _grid(self) -> tuple[int, int, int]:
        vc = self.config.vision_config
        patch = int(vc.patch_size)
        offset = 1 if self.config.vision_feature_select_strategy == "default" else 0
        return int(vc.image_size) // patch, patch, offset

    def _capture(self, want):
        return A.record(self.model.model.vision_tower, want, self.config.vision_feature_layer,
                        self.model.model.multi_modal_projector)

    def _encode_visual(self, media, templated: str, want, held=None, views: str = "all") -> dict:
        if isinstance(media, Video):
            return self._encode_video(media, templated, want)
        images = media if isinstance(media, list) else [media]
        g, patch, offset = self._grid()
        inputs = self.processor(images=[images], text=templated, return_tensors="pt")
        if views == "base" and len(images) == 1:  # several images, a video: already one view each
            return self._encode_base(images[0], templated, inputs, want)
        pixels = inputs["pixel_values"].to(self.device, self.dtype)
        with self._capture(want) as rec:
            out = self.model.model.get_image_features(
                pixel_values=pixels, image_sizes=inputs["image_sizes"].to(self.device),
                batch_num_images=inputs["batch_num_images"].to(self.device), return_dict=True)
        visual = torch.cat(list(out.pooler_output), dim=0)  # (N_V, d)
        if len(images) == 1:
            lay = Layout(int(pixels.shape[1]), g * g)
            L.anyres_image(lay, self.model, inputs["image_sizes"][0], g, patch)
            frames = [images[0], images[0]]
        else:
            lay = Layout(len(images), g * g)
            for k, im in enumerate(images):
                L.square_image(lay, k, k, im.size, g, patch)
            frames = list(images)
        res = self._finish(lay, visual, inputs["input_ids"], frames, dict(inputs), rec, want, offset)
        if want.features:  # the projector's input per view, packed as the tokens (anyres shrink: bilinear too)
            f = rec.features()  # (views, g*g, D_v)
            split = [f.shape[0]] if len(images) == 1 else [1] * len(images)
            zero = torch.zeros(f.shape[-1], dtype=f.dtype, device=f.device)  # newline rows: zeros
            packed, _ = self.model.model.pack_image_features(
                list(torch.split(f, split)), inputs["image_sizes"].to(self.device), image_newline=zero,
                vision_aspect_ratio=self.config.vision_aspect_ratio)
            res["features"] = torch.cat(list(packed), dim=0) if isinstance(packed, (list, tuple)) else packed
        return res

    def _encode_base(self, image, templated: str, inputs, want) -> dict:
        """One image read as its base view only (`views="base"`): the processor's first view (the same pixels
        as the anyres encoding's), g x g tokens and one newline, as the model reads a one-view image
        (`pack_image_features`: a single view gets the newline after it). transformers reads an image as one
        view when its sample holds several images (`batch_num_images` != 1, `get_image_features` and the
        processor's `replace_image_token`); a one-image sample is always tiled, so the call passes
        batch_num_images = [2] with the one image's pixels and size: the model's own path then reads that one
        image unpatched. `ref` carries the same inputs, so that the model run on them is the anchor."""
        g, patch, offset = self._grid()
        pixels = inputs["pixel_values"][:, :1]  # (1, 1, 3, S, S): the base view
        proc = self.processor
        n = proc.num_image_tokens + 1 - (proc.vision_feature_select_strategy == "default")  # its replace_image_token
        ids = self._tokenize(templated.replace(proc.image_token, proc.image_token * n))["input_ids"]
        one_view = torch.tensor([2], device=self.device)
        with self._capture(want) as rec:
            out = self.model.model.get_image_features(
                pixel_values=pixels.to(self.device, self.dtype), image_sizes=inputs["image_sizes"].to(self.device),
                batch_num_images=one_view, return_dict=True)
        visual = torch.cat(list(out.pooler_output), dim=0)  # (g*g + 1, d)
        lay = Layout(1, g * g)
        L.base_view(lay, image.size, g, patch)
        ref = dict(input_ids=ids, attention_mask=torch.ones_like(ids), pixel_values=pixels,
                   image_sizes=inputs["image_sizes"], batch_num_images=one_view.cpu())
        res = self._finish(lay, visual, ids, [image], ref, rec, want, offset)
        if want.features:  # the projector's input of the base view, the newline row 0
            f = rec.features().flatten(0, 1)  # (g*g, D_v)
            res["features"] = torch.cat([f, f.new_zeros(1, f.shape[-1])])
        return res

    def _encode_video(self, video: Video, templated: str, want) -> dict:
        frames = list(video.frames)
        if not frames:
            raise MediaError("a video with no frames")
        g, patch, offset = self._grid()
        pixels = video_pixels(frames, self.video).unsqueeze(0)  # (1, F, 3, H, W)
        token = self.processor.video_token
        if templated.count(token) != 1:
            raise ValueError(f"the prompt must hold exactly one {token} placeholder, found {templated.count(token)}")
        expanded = templated.replace(token, self.processor.replace_video_token({"pixel_values_videos": pixels}, 0))
        ids = self._tokenize(expanded)["input_ids"]
        with self._capture(want) as rec:
            out = self.model.model.get_video_features(pixel_values_videos=pixels.to(self.device, self.dtype),
                                                      return_dict=True)
        visual = out.pooler_output.flatten(0, 1)  # (F * ceil(g/2)^2 + 1, d)
        lay = Layout(len(frames), g * g)
        L.video_frames(lay, len(frames), frames[0].size, g, patch)
        ref = dict(input_ids=ids, attention_mask=torch.ones_like(ids), pixel_values_videos=pixels)
        res = self._finish(lay, visual, ids, frames, ref, rec, want, offset)
        res["is_video"] = True
        if want.features:  # the projector's input (F, g*g, D_v), pooled 2x bilinearly as the tokens, newline 0
            f = self.model.model.apply_pooling(rec.features()).flatten(0, 1)  # (F * ceil(g/2)^2, D_v)
            res["features"] = torch.cat([f, f.new_zeros(1, f.shape[-1])])  # (N_V, D_v)
        return res

    def _finish(self, lay, visual, ids, frames, ref, rec, want, offset) -> dict:
        geometry = lay.geometry()
        if len(geometry) != visual.shape[0]:
            raise RuntimeError(f"geometry has {len(geometry)} tokens, the model gave {visual.shape[0]}")
        out = dict(input_ids=ids, visual=visual, geometry=geometry, frames=frames, ref=ref)
        if want.attention:
            raw = rec.cap["attention"].cpu()
            att, keys = rec.finish(out, lambda a, k: token_attention(lay, a, k, offset))
            out.update(attention=att, keys=keys, has_cls=False, cls=None, state={"attention_all": raw})
        return out
