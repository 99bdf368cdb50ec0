"""Video-LLaVA (transformers `VideoLlavaForConditionalGeneration`, model_type "video_llava").

Images and videos. A video is sampled to 8 frames (`default_frames`; Video-LLaVA was trained on
8) with PyAV, at i * n // 8 as transformers' `BaseVideoProcessor.sample_frames` picks num_frames=8
(`mipruner.media.sample_indices`; every frame of a shorter clip, where transformers refuses); a
list of several PIL images is taken as the frames of one video.

Tokens, in LLM order:
  image  the image tower's patch grid (CLS dropped under the "default" strategy), like LLaVA-1.5.
  video  per frame, in frame order: the frame's [CLS] token (transformers' Video-LLaVA keeps it
         for videos: N_V = F x (grid + 1), 8 x 257 = 2056 for the 7B model), then its patch grid.
         CLS tokens have kind "cls", row = col = -1 and the box of the whole visible frame.

Preprocessing: transformers' Video-LLaVA *video* processor needs torchvision, which is not usable
on the machines this project targets, so frames are prepared by the image processor (PIL/NumPy), which the
checkpoints configure identically (shortest-edge resize + center crop + CLIP normalisation), and
the `<image>` / `<video>` placeholder is expanded here to the number of tokens the model returns.
The plain-model inputs this builds are kept in `Encoded.state.ref` (the tests check them
against `model.generate`).

Attention (need_attention=True): for an image, (N+1, N+1) of the image tower with CLS first; for a
video, the frames attend only within themselves, and every frame's CLS is itself a visual token,
so `attention` is block-diagonal (N_V, N_V) over the F blocks of (N+1, N+1) in token order, with
no separate CLS (`has_cls` False), and `keys` is (N_V, d_head). This is the "(N, N)" form the
attention pruners take; the per-frame stack (F, N+1, N+1) stays in `state.extra["attention_per_frame"]`.
"""
from __future__ import annotations

import torch

from ...media import MediaError, Video
from ..common import clip_attention as A
from ..common import hf_adapter as C
from .media import single_image
from . import short_tower as T
from . import geometry as G
from ..base import LazyGeometry, TokenGeometry
from .llava_hf import cls_first, image_geometry


class VideoLlavaAdapter(C.ProcessorAdapter):
    family = "video_llava"
    model_class_name = "VideoLlavaForConditionalGeneration"
    default_frames = 8  # Video-LLaVA samples 8 frames per video

    @classmethod
    def _load_processor(cls, path: str):
        """Tokenizer + image processor (the combined processor needs torchvision for its video part)."""
        from transformers import AutoImageProcessor, AutoTokenizer

        tok = AutoTokenizer.from_pretrained(path)
        ip = AutoImageProcessor.from_pretrained(path)
        return None, tok, ip

    def _template(self, prompt: str, kind: str, n_media: int = 1) -> str:
        return C.chat_prompt(self.tokenizer, prompt, kind, fallback="USER: <" + kind + ">\n{prompt} ASSISTANT:")

    def _pixels(self, images) -> torch.Tensor:
        out = self.image_processor(images=images, return_tensors="pt", return_legacy_image_output=False)
        return out["pixel_values"].to(self.device, self.dtype)  # (B, 3, Hp, Wp)

    def _one_placeholder(self, templated: str, token_id: int, n: int) -> list[int]:
        """[n]: the one `token_id` placeholder of the templated prompt stands for n tokens, which `encode` expands in
        its own tokenization of the prompt (tokenized once); ValueError unless the prompt holds exactly one."""
        token = self.tokenizer.convert_ids_to_tokens(token_id)
        if templated.count(token) != 1:
            raise ValueError(f"the prompt must hold exactly one {token} placeholder, found {templated.count(token)}")
        return [int(n)]

    def _encode_visual(self, media, templated: str, want, held=None) -> dict:
        is_video = isinstance(media, Video) or (isinstance(media, list) and len(media) > 1)
        if not is_video:
            return self._encode_image(single_image(media, "Video-LLaVA"), templated, want)
        frames = media.frames if isinstance(media, Video) else list(media)
        if not frames:
            raise MediaError("a video with no frames")
        pixels = self._pixels(frames).unsqueeze(0)  # (1, F, 3, Hp, Wp)
        tower = self.model.model.video_tower
        with A.record(tower, want, self.config.vision_feature_layer, self.model.model.multi_modal_projector) as rec:
            feats = self.model.model.get_video_features(pixel_values_videos=pixels, return_dict=True).pooler_output
        n_f, per_frame = feats.shape[0], feats.shape[1]  # (F, N+1, d)
        visual = feats.reshape(n_f * per_frame, -1)  # (F*(N+1), d), frame-major as the model scatters them
        hw = tuple(pixels.shape[-2:])
        cls_first(self, hw, per_frame)  # the count checked now; the geometry built when first read

        def build() -> TokenGeometry:
            parts, grids = [], []
            for f, frame in enumerate(frames):
                g, _ = image_geometry(self, frame, hw, per_frame, frame=f)
                parts.append(dict(frame=g.frame, row=g.row, col=g.col, box=g.box, kind=g.kind))
                grids += g.grids
            return G.cat_geometry(parts, grids, [fr.size for fr in frames])

        geometry = LazyGeometry(build)
        out = dict(placeholders=self._one_placeholder(templated, self.config.video_token_id, visual.shape[0]),
                   visual=visual, geometry=geometry, frames=list(frames), is_video=True,
                   ref=dict(pixel_values_videos=pixels.cpu()))
        if want.features:  # the projector's input, (F, N+1, D_v): each frame's [CLS] and patches, as the tokens
            out["features"] = rec.features().flatten(0, 1)  # (N_V, D_v)
        if want.attention:
            per_frame_att = rec.cap["attention"].cpu()  # (F, N+1, N+1)
            att, keys = rec.finish(out, lambda a, k: (torch.block_diag(*a.cpu()),  # (N_V, N_V), N_V = F * (N+1)
                                                      k.cpu().reshape(n_f * per_frame, -1)))  # (N_V, d_head)
            out.update(attention=att, keys=keys, has_cls=False, state={"attention_per_frame": per_frame_att})
        return out

    def _encode_image(self, image, templated: str, want) -> dict:
        pixels = self._pixels([image])  # (1, 3, Hp, Wp)
        tower = self.model.model.image_tower
        with A.record(tower, want, self.config.vision_feature_layer, self.model.model.multi_modal_projector) as rec:
            if T.applies(self.model, tower):  # the tower up to the block the projector reads (`short_tower`)
                outputs = T.image_features(self.model, tower, pixels, upto=max(rec.asked.values(), default=-1) + 1)
            else:
                outputs = self.model.model.get_image_features(pixel_values=pixels, return_dict=True)
        visual = torch.cat(list(outputs.pooler_output))  # (N_V, d)
        hw, n = tuple(pixels.shape[-2:]), visual.shape[0]
        cls_first(self, hw, n)  # the count checked now; the geometry built when first read
        geometry = LazyGeometry(lambda: image_geometry(self, image, hw, n)[0])
        out = dict(placeholders=self._one_placeholder(templated, self.config.image_token_id, visual.shape[0]),
                   visual=visual, geometry=geometry, frames=[image], ref=dict(pixel_values=pixels.cpu()))
        if want.features:  # the projector's input (1, n, D_v)
            out["features"] = rec.features().flatten(0, 1)  # (N_V, D_v)
        if want.attention:
            att, keys = rec.finish(out, lambda a, k: (a[0], k[0]))
            out.update(attention=att, keys=keys, has_cls=True, cls=A.projected_cls(self.model, outputs))  # (1, d)
        return out
