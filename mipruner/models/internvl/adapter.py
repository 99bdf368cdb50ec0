"""InternVL (transformers `InternVLForConditionalGeneration`, model_type "internvl": InternVL3 and
InternVL2.5 "-hf" checkpoints): InternViT + pixel shuffle (0.5) + 2-layer MLP + Qwen2.5 (or InternLM2 /
Llama), one image, several images, video.

Tokens in LLM order and their geometry are described in `layout.py`. In short, each image
becomes "<img>" + (tiles [+ thumbnail]) x image_seq_length <IMG_CONTEXT> tokens + "</img>" (tiles:
the image stretched to the c x r canvas of S px tiles the GotOcr2 image processor picks, up to
max_patches; the thumbnail: the whole image at S x S, only when there are several tiles); several
images are several such blocks; a video is one block per frame, "Frame{i}: <img>...</img>" joined by
newlines. <img>, </img> and the "Frame{i}: " words are text tokens; only <IMG_CONTEXT> rows are visual.

Inputs: hub checkpoints name a video processor whose class needs torchvision, so `AutoProcessor`
cannot be built here. The adapter builds transformers' `InternVLProcessor` with its own constructor
from the checkpoint's tokenizer, image processor (GotOcr2, the PIL backend) and
processor_config.json (`_processor`), and calls its own `__call__` for images and videos, so input
ids and pixel values are the processor's. Its video slot holds `PreparedFrames`
(`common/video_slot.py`), which hands over frames prepared as `InternVLVideoProcessor` prepares
them: sampled by its `sample_frames` rule (`frame_indices`), each resized to its size (PIL bicubic
where transformers uses torchvision's: pixels differ by interpolation rounding), rescaled and
normalised with its settings.

Attention (need_attention=True). InternViT puts a [CLS] in front of every view; the "default" feature
strategy drops it before the pixel shuffle, so it never reaches the LLM. `has_cls` is True and
`attention` is (N_V+1, N_V+1), [CLS] first: row 0 = the attention each token's four patches receive
from their view's [CLS] (summed), the token block = the feature layer's attention (head mean) pooled
to tokens (a token's row: the mean over its patches of the attention summed over each other token's
patches), 0 across views (tiles, thumbnail, images, frames). `keys` (N_V+1, d_head): view 0's [CLS]
key, then each token's mean patch key. `cls` is None: the projector reads four patches' features
side by side (4 x width), so a [CLS] row has no image in the LLM's input space. Hence "attention"
ranks by [CLS] attention, VisionZip keeps dominant tokens by it and merges the rest with no [CLS]
prefix, VisPruner takes it for its important tokens, MI-Attention as its prior; FastV, DART and
SparseVLM read the decoder through `llm_inputs` (positions 0..L-1, as the model's forward).
"""
from __future__ import annotations

import torch

from ...media import MediaError, Video
from . import layout as L
from ..common import hf_adapter as C
from ..common.clip_attention import feature_layer_index
from ..common.patch_layout import Layout
from ..common.signals import Record
from ..common.hub_files import read_chat_template, read_json
from ..common.sampled_video import SampledVideo, frames_asked, video_pixels
from ..common.video_slot import build_processor

# InternVLVideoProcessor's class defaults (transformers 5.x)
VIDEO_DEFAULTS = dict(size={"height": 384, "width": 384}, resample=3, do_rescale=True, rescale_factor=1 / 255,
                      do_normalize=True, image_mean=[0.48145466, 0.4578275, 0.40821073],
                      image_std=[0.26862954, 0.26130258, 0.27577711], do_sample_frames=False, num_frames=None,
                      fps=None, initial_shift=True)


def frame_indices(total: int, video_fps: float, s: dict, default: int) -> list[int]:
    """The frames `InternVLVideoProcessor.sample_frames` reads: k = num_frames (or int(duration * fps)),
    at torch.arange(shift, total, total / k).int() with shift = total / k / 2 when `initial_shift` is
    True (the middle of each of k equal segments). With `do_sample_frames` off (the hub default, where
    transformers reads every frame, too many for any real clip) k = `default`. Every frame where
    transformers would refuse (k > total, a numeric shift past the clip, or sampling with neither
    num_frames nor fps); at least one."""
    if total <= 0:
        return []
    k = frames_asked(total, video_fps, s, default)
    if k is None:
        return list(range(total))
    shift = s["initial_shift"]
    shift = total / k / 2 if shift is True else float(shift or 0)
    if k > total or shift >= total:
        return list(range(total))
    return torch.arange(shift, total, total / k).int().tolist()


def _processor(ip, tok, pcfg: dict, chat_template):
    """transformers' InternVLProcessor built by its own constructor on the checkpoint's parts, frames the adapter
    prepares in its video slot (`common.video_slot`)."""
    from transformers import InternVLProcessor

    names = ("start_image_token", "end_image_token", "context_image_token", "video_token")
    missing = [n for n in names if getattr(tok, n, None) is None]
    if missing:
        raise ValueError(f"the tokenizer does not name InternVL's special tokens {missing} (tokenizer_config.json's "
                         "extra_special_tokens); is this an InternVL '-hf' checkpoint?")
    return build_processor(InternVLProcessor, image_processor=ip, tokenizer=tok,
                           image_seq_length=int(pcfg.get("image_seq_length", 256)), chat_template=chat_template)


class InternVLAdapter(SampledVideo, C.ProcessorAdapter):
    family = "internvl"
    model_class_name = "InternVLForConditionalGeneration"
    frame_rule = staticmethod(frame_indices)
    video_defaults = VIDEO_DEFAULTS

    def __init__(self, *args, video_config: dict | None = None, **kwargs):
        super().__init__(*args, video_config=video_config, **kwargs)
        if self.config.vision_feature_select_strategy != "default":
            raise ValueError("InternVL's pixel shuffle needs a square patch grid: only vision_feature_select_strategy "
                             f"'default' (drop the [CLS]) works, the config says "
                             f"{self.config.vision_feature_select_strategy!r}")
        vc = self.config.vision_config
        self.tile_hw = L.tile_size(self.image_processor)
        self.g = int(vc.image_size[0]) // int(vc.patch_size[0])
        self.owner = L.shuffle_owner(self.model, self.g)  # (h*h, 4) patches behind each token of a view
        if self.owner.shape[0] != self.processor.image_seq_length:
            raise ValueError(f"image_seq_length {self.processor.image_seq_length} in processor_config.json does not "
                             f"match the model's {self.owner.shape[0]} tokens a tile")

    @classmethod
    def _load_processor(cls, path: str):
        from transformers import AutoImageProcessor, AutoTokenizer

        tok = AutoTokenizer.from_pretrained(path)
        ip = AutoImageProcessor.from_pretrained(path)
        return _processor(ip, tok, read_json(path, "processor_config.json"), read_chat_template(path, tok)), tok, ip

    def _template(self, prompt: str, kind: str, n_media: int = 1) -> str:
        return super()._template(prompt, kind, 1 if kind == "video" else n_media)

    def _visual_token_ids(self) -> list[int]:
        return [int(self.config.image_token_id)]

    # -- encode --------------------------------------------------------------------------------

    def _capture(self, want):
        """The `common.signals.Record` of InternViT's blocks (keys after `k_norm`) and the projector's input."""
        tower = self.model.model.vision_tower
        n = len(tower.encoder.layer)
        return Record(want, n, feature_layer_index(self.config.vision_feature_layer, n),
                      lambda b, heads: L.capture(tower, b, heads=heads), self.model.model.multi_modal_projector)

    def _expanded(self, templated: str, replacements: list[str]) -> str:
        """The prompt with each placeholder replaced by its expansion (the text the processor tokenizes)."""
        it = iter(replacements)
        return self.processor.multimodal_pattern.sub(lambda _m: next(it), templated)

    def _encode_visual(self, media, templated: str, want, held=None) -> dict:
        p = self.processor
        if isinstance(media, Video):
            frames = list(media.frames)
            if not frames:
                raise MediaError("a video with no frames")
            pixels = video_pixels(frames, self.video)  # (F, 3, H, W)
            inputs = p(text=templated, videos=[pixels], return_tensors="pt")
            lay = Layout(len(frames), self.g * self.g)
            L.video_views(lay, len(frames), self.owner, self.g, frames[0].size, pixels.shape[-2:])
            expanded = self._expanded(templated, [p.replace_video_token({"pixel_values_videos": [pixels]}, 0)])
            shown = frames
        else:
            images = media if isinstance(media, list) else [media]
            inputs = p(images=images, text=templated, return_tensors="pt")
            lay = Layout(int(inputs["pixel_values"].shape[0]), self.g * self.g)
            view = frame = 0
            counts, shown = [], []
            for im in images:
                grid = L.tile_grid(self.image_processor, (im.height, im.width), tiled=True)
                dv, df = L.image_views(lay, view, frame, self.owner, self.g, im.size, grid, self.tile_hw)
                view, frame = view + dv, frame + df
                counts.append(dv)
                shown += [im] * df
            if view != inputs["pixel_values"].shape[0]:
                raise RuntimeError(f"{view} tiles expected, the processor made {inputs['pixel_values'].shape[0]}")
            expanded = self._expanded(templated, [p.replace_image_token({"num_patches": counts}, i)
                                                  for i in range(len(images))])
        pixels = inputs["pixel_values"].to(self.device, self.dtype)
        with self._capture(want) as rec:
            out = self.model.model.get_image_features(pixel_values=pixels, return_dict=True)
        visual = out.pooler_output.flatten(0, 1)  # (views * h*h, d)
        geometry = lay.geometry()
        if len(geometry) != visual.shape[0]:
            raise RuntimeError(f"geometry has {len(geometry)} tokens, the model gave {visual.shape[0]}")
        res = dict(input_ids=inputs["input_ids"], visual=visual, geometry=geometry, frames=shown, expanded=expanded,
                   is_video=isinstance(media, Video),
                   ref=dict(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"],
                            pixel_values=inputs["pixel_values"]))
        if want.features:  # the projector's input: each token's 4 pixel-shuffled patch states side by side
            res["features"] = rec.features().flatten(0, 1)  # (N_V, 4 * D_v)
        if want.attention:
            raw = rec.cap["attention"].cpu()
            att, keys = rec.finish(res, lambda a, k: L.cls_attention(lay, a, k))
            res.update(attention=att, keys=keys, has_cls=True, cls=None, state={"attention_all": raw})
        return res
