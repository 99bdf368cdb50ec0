"""LLaVA-OneVision in vLLM with mipruner's pruning of images and videos: vLLM's
LlavaOnevisionForConditionalGeneration (vllm-project/vllm, vllm/model_executor/models/llava_onevision.py), whose
`embed_multimodal` returns K of each image's or video's N tokens, chosen by `mipruner.prune`.

The N tokens are what vLLM's model returns for the item, in the order mipruner's own adapter
(`mipruner.models.onevision`) encodes them:
  image  `_process_image_input` (`_merge_image_patch_embeddings`, "spatial_unpad", anyres_max_9): the base view's
         g x g grid, then the unpadded canvas (bilinearly shrunk when over 9 tiles' worth) row by row, each row
         followed by one `image_newline` token;
  video  `_process_video_pixels`: each frame's grid pooled to ceil(g/2) x ceil(g/2) (`apply_pooling`), frame by
         frame, then ONE newline token for the whole video.
As in `mipruner.select`, the newlines are visual tokens like any other: they count in N and in K, and a method
keeps one only if it selects it. vLLM's `LlavaOnevisionProcessingInfo.get_num_image_tokens` /
`get_num_video_tokens` state N before scheduling and the front end (`processing.py`) writes K of them. The worker
gives each method mipruner's geometry: the (view, row, col) grid (`pool`; views: base and canvas, or one per
frame; newlines view -1) and `frame_index` (an image: 0; a video: its frame; the newlines -1: the per-frame option,
EVS and VidCom2 rank them in no frame, as on mipruner's encoding).

Positions: OneVision's language model (Qwen2) uses 1-D RoPE, so the K kept tokens sit at consecutive positions
and the text after the item moves up by N - K: mipruner's "compact" positions (as `llava.py` says).
Not covered: several images in one prompt (transformers reads each as its base view only, vLLM as anyres).
"""
from __future__ import annotations

import math

import torch
from vllm.model_executor.models.llava_onevision import (LlavaOnevisionDummyInputsBuilder,
                                                        LlavaOnevisionForConditionalGeneration,
                                                        LlavaOnevisionMultiModalProcessor,
                                                        LlavaOnevisionProcessingInfo)
from vllm.multimodal import MULTIMODAL_REGISTRY

from .llava_next import canvas_grid
from .processing import FIELD, VIDEO_FIELD, InfoMixin, ProcessorMixin
from .request import PruneRequest
from .select import choose, grid_rows, image_frames


def image_grid(model, image_size, views: int, n: int, device=None) -> torch.Tensor:
    """(n, 3) (view, row, col) of one anyres image of `views` tower views: the canvas's extent read off vLLM's own
    `_merge_image_patch_embeddings` run on a zero canvas with a marker newline (so unpad and shrink are its own)."""
    g = int(model.config.vision_config.image_size) // int(model.config.vision_config.patch_size)
    marks = model._merge_image_patch_embeddings(torch.as_tensor(image_size).reshape(-1), torch.zeros(views, g * g, 1),
                                                image_newline=torch.ones(1), strategy="spatial_unpad")[:, 0]
    rows = int(marks.sum())
    cols = (int(marks.numel()) - g * g - rows) // max(rows, 1)
    grid = canvas_grid(g, rows, cols, device)
    if grid.shape[0] != n or not torch.equal((grid[:, 0] < 0).cpu(), marks > 0):
        raise RuntimeError(f"mipruner: a LLaVA-OneVision image of {n} tokens is not a {g}x{g} base view and a "
                           f"{rows}x{cols} canvas with row newlines")
    return grid


def video_grid(frames: int, n: int, device=None) -> torch.Tensor:
    """(n, 3) (frame, row, col) of a video's `frames` pooled h x h grids, then its one newline (-1, h, h)."""
    h = math.isqrt((n - 1) // max(frames, 1))
    if frames * h * h + 1 != n:
        raise RuntimeError(f"mipruner: a LLaVA-OneVision video of {n} tokens is not {frames} square frames "
                           f"and one newline")
    return torch.cat([grid_rows(h, h, device, frames), torch.tensor([[-1, h, h]], device=device)])


class MiPrunerLlavaOnevisionProcessingInfo(InfoMixin, LlavaOnevisionProcessingInfo):
    pass


class MiPrunerLlavaOnevisionMultiModalProcessor(ProcessorMixin, LlavaOnevisionMultiModalProcessor):
    _mipruner_media = ("image", "video")

    def _postprocess_hf_mm_data(self, mm_inputs, hf_processor_mm_kwargs, processed_data):
        """vLLM's `LlavaOnevisionMultiModalProcessor._apply_hf_processor_main` pops a video prompt's images and
        videos before it finalizes (and calls the HF processor with the request's kwargs, so transformers warns
        that it ignores the mipruner_* ones): the items are then counted from what the HF processor returned."""
        mm_inputs = dict(mm_inputs)
        for key, field in (("images", "pixel_values"), ("videos", "pixel_values_videos")):
            if not mm_inputs.get(key) and processed_data.get(field) is not None:
                mm_inputs[key] = list(processed_data[field])
        return super()._postprocess_hf_mm_data(mm_inputs, hf_processor_mm_kwargs, processed_data)


@MULTIMODAL_REGISTRY.register_processor(MiPrunerLlavaOnevisionMultiModalProcessor,
                                        info=MiPrunerLlavaOnevisionProcessingInfo,
                                        dummy_inputs=LlavaOnevisionDummyInputsBuilder)
class MiPrunerLlavaOnevisionForConditionalGeneration(LlavaOnevisionForConditionalGeneration):
    def embed_multimodal(self, **kwargs):
        """As vLLM's (the items in the order of `_parse_and_validate_multimodal_inputs`), each pruned item K rows."""
        specs, vspecs = kwargs.pop(FIELD, None), kwargs.pop(VIDEO_FIELD, None)
        if specs is None and vspecs is None:
            return super().embed_multimodal(**kwargs)
        mm = self._parse_and_validate_multimodal_inputs(**kwargs)
        embed_ids = self.get_language_model().embed_input_ids
        out: tuple[torch.Tensor, ...] = ()
        for modality, inp in mm.items():
            if modality == "image":
                for i, emb in enumerate(self._process_image_input(inp)):
                    req = None if specs is None else PruneRequest.from_tensor(specs[i])
                    if req is not None:
                        grid = image_grid(self, inp["image_sizes"][i], len(inp["pixel_values"][i]), emb.shape[0],
                                          emb.device)
                        emb = choose(req, emb, embed_ids, grid=grid, frame_index=image_frames(grid))[0]
                    out += (emb,)
            elif modality == "video":
                pixels = inp["pixel_values_videos"]
                for j, emb in enumerate(self._process_video_pixels(inp)):
                    req = None if vspecs is None else PruneRequest.from_tensor(vspecs[j])
                    if req is not None:  # vLLM's (N, d) or (1, N, d) per video: K rows in the same form
                        flat, frames = emb.reshape(-1, emb.shape[-1]), len(pixels[j])
                        grid = video_grid(frames, flat.shape[0], emb.device)
                        rows = choose(req, flat, embed_ids, frames=frames, grid=grid, frame_index=grid[:, 0])[0]
                        emb = rows.reshape(*emb.shape[:-2], -1, emb.shape[-1])
                    out += (emb,)
        return out
