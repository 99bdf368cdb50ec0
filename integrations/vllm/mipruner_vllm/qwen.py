"""Qwen2.5-VL in vLLM with mipruner's pruning of images and videos.

`embed_multimodal` returns K of each image's or video's merged tokens, chosen by `mipruner.prune`, each with
4 extra channels (t, h, w, extent): its M-RoPE column in the unpruned image and the image's
unpruned extent. vLLM's runner (`recompute_mrope_positions`, the mechanism of vLLM's EVS) strips
them and places the kept tokens at their unpruned columns, the text after the image where it is
without pruning: so the kept tokens keep their unpruned M-RoPE positions, as mipruner's adapters
do. (vLLM's EVS writes llm_grid_w as the extent; the unpruned extent here makes K = N equal
unmodified vLLM for every aspect ratio.) The runner applies it only when its multimodal-pruning
flag is on: `runner.enable_position_recompute` sets it for these classes.
A video's tokens are frame-major (t, h', w'); the worker gives the method `frame_index` (each token's
token-frame: 2 sampled frames) and the (t, row, col) grid, so EVS, VidCom2 and every method's per-frame
option run as in `mipruner.select`. An engine started with vLLM's own `--video-pruning-rate` keeps vLLM's
EVS for videos, and the front end refuses `mipruner_method` on its videos.
"""
from __future__ import annotations

import torch
from vllm.model_executor.models.qwen2_5_vl import (Qwen2_5_VLDummyInputsBuilder, Qwen2_5_VLForConditionalGeneration,
                                                   Qwen2_5_VLMultiModalProcessor, Qwen2_5_VLProcessingInfo)
from vllm.multimodal import MULTIMODAL_REGISTRY
from vllm.multimodal.video_prune.evs import compute_mrope_for_media

from .processing import FIELD, VIDEO_FIELD, InfoMixin, ProcessorMixin
from .request import PruneRequest
from .select import choose


def with_positions(emb: torch.Tensor, thw, merge: int, tokens_per_second: float = 1.0, seconds: float = 1.0):
    """(N, d + 4): emb with each token's unpruned (t, h, w) column and the media's extent."""
    pos = compute_mrope_for_media(thw, merge, tokens_per_second, seconds)
    pos[:, 3] = pos[:, :3].max() + 1  # where the text after the media starts, as without pruning
    return torch.cat([emb, pos.to(device=emb.device, dtype=emb.dtype)], dim=1)


class QwenModelMixin:
    """The worker of the Qwen classes: this one's, Qwen2-VL's (`qwen2_vl.py`, which adds the
    `recompute_mrope_positions` vLLM's Qwen2-VL lacks) and Qwen3-VL's images (`qwen3_vl.py`)."""

    mipruner_mrope_recompute = True  # read by runner.enable_position_recompute

    def mipruner_reads(self, emb: torch.Tensor) -> torch.Tensor:
        """The columns of a medium's rows the method reads (all; Qwen3-VL: the main rows, not DeepStack's):
        the columns after them travel with the kept rows."""
        return emb

    def iter_mm_grid_thw(self, mm_features):
        """As vLLM's, but a pruned image spans its K placeholders (a 1 x K strip): the initial positions
        then have the prompt's length; the runner rewrites them from the image on."""
        by_offset = {f.mm_position.offset: f for f in mm_features}
        for offset, t, h, w, t_factor in super().iter_mm_grid_thw(mm_features):
            k = by_offset[offset].mm_position.length
            yield (offset, 1, 1, k, 1.0) if k != t * h * w else (offset, t, h, w, t_factor)

    def embed_multimodal(self, **kwargs):
        specs, vspecs = kwargs.pop(FIELD, None), kwargs.pop(VIDEO_FIELD, None)
        mm = self._parse_and_validate_multimodal_inputs(**kwargs)
        merge = self.visual.spatial_merge_size
        embed_ids = self.get_language_model().embed_input_ids
        out: tuple[torch.Tensor, ...] = ()
        for modality, inp in mm.items():  # keys "image"/"video" (Qwen2.5-VL) or "images"/"videos" (Qwen2-VL)
            modality = modality.removesuffix("s")
            if modality == "image":
                grids = inp["image_grid_thw"].tolist()
                for i, (emb, thw) in enumerate(zip(self._process_image_input(inp), grids)):
                    full = with_positions(emb, thw, merge)
                    req = None if specs is None else PruneRequest.from_tensor(specs[i])
                    if req is not None:
                        seen = self.mipruner_reads(emb)
                        rows, keep = choose(req, seen, embed_ids, (thw[1] // merge, thw[2] // merge))
                        full = torch.cat([rows, full[keep, seen.shape[1]:]], dim=1)
                    out += (full,)
            elif modality == "video":
                videos = self._process_video_input(inp)
                if getattr(self, "video_pruning_rate", None):  # vLLM's own EVS (--video-pruning-rate), unchanged
                    out += tuple(self._postprocess_video_embeds_evs(videos, inp))
                    continue
                tps = float(getattr(self.config.vision_config, "tokens_per_second", 1.0))
                secs = inp.get("second_per_grid_ts")
                for j, (emb, thw) in enumerate(zip(videos, inp["video_grid_thw"].tolist())):
                    s = float(secs[j]) if secs is not None else 1.0
                    full = with_positions(emb, thw, merge, tps, s)
                    req = None if vspecs is None else PruneRequest.from_tensor(vspecs[j])
                    if req is not None:  # frame-major tokens: thw[0] frames of (h', w')
                        seen = self.mipruner_reads(emb)
                        rows, keep = choose(req, seen, embed_ids, (thw[1] // merge, thw[2] // merge), thw[0])
                        full = torch.cat([rows, full[keep, seen.shape[1]:]], dim=1)
                    out += (full,)
        return out


class MiPrunerQwen2_5_VLProcessingInfo(InfoMixin, Qwen2_5_VLProcessingInfo):
    pass


class MiPrunerQwen2_5_VLMultiModalProcessor(ProcessorMixin, Qwen2_5_VLMultiModalProcessor):
    _mipruner_media = ("image", "video")
    _vllm_prunes_video = True  # vLLM's own EVS under --video-pruning-rate


@MULTIMODAL_REGISTRY.register_processor(MiPrunerQwen2_5_VLMultiModalProcessor, info=MiPrunerQwen2_5_VLProcessingInfo,
                                        dummy_inputs=Qwen2_5_VLDummyInputsBuilder)
class MiPrunerQwen2_5_VLForConditionalGeneration(QwenModelMixin, Qwen2_5_VLForConditionalGeneration):
    pass
