"""Qwen3-VL images in vLLM with mipruner's pruning: the Qwen worker (`qwen.QwenModelMixin`) on vLLM's
`Qwen3VLForConditionalGeneration` (vllm-project/vllm, vllm/model_executor/models/qwen3_vl.py).

DeepStack. vLLM's `Qwen3VLForConditionalGeneration._process_image_input` returns each image's merged tokens as
(N, visual_dim * (1 + levels)): the main rows, then one block per DeepStack level, which its `embed_input_ids`
(`_compute_deepstack_embeds`) splits off and adds after the first decoder layers. The method reads the main rows
(`mipruner_reads`: what mipruner's Qwen3-VL adapter prunes, the tower's `pooler_output`); the kept rows carry their
DeepStack blocks along, the same keep (a merging method's merged row, the DeepStack rows of its slot, as
mipruner's adapter gives `deepstack_features[idx]`).

Positions. vLLM's own pruning path (`_postprocess_image_embeds_evs`, `recompute_mrope_positions`) tags images with
5 channels (t, h, w, llm_grid_w, 0), and `vllm.multimodal.video_prune.evs.recompute_mrope_positions` then starts
the text after a 5-channel medium at its largest *kept* position + 1: after a pruned image that is not where the
text is without pruning. So an image here carries the mixin's 4 channels (t, h, w, unpruned extent) and this class
recomputes with them (`qwen2_vl.FourChannelPositions`, the same vLLM function): the kept tokens at their unpruned
columns, the text after the image where it is unpruned (its largest column + 1, as vLLM's
`_get_mrope_input_positions` places it). `get_mrope_input_positions` gives the runner the pruned prompt's initial
positions (a pruned image read as a 1 x K strip, as `QwenModelMixin.iter_mm_grid_thw` does for Qwen2/2.5-VL);
the runner rewrites them from the image on.

Videos are not covered yet: a Qwen3-VL video is frames interleaved with timestamp text, positioned with the
5 channels (t, h, w, is_vision_start, is_vision) of vLLM's `_create_final_video_embeddings`. This model's
`*ProcessingInfo.get_supported_mm_limits` declares images only, so vLLM refuses a video on this architecture (and
profiles none) instead of positioning it wrongly; serve videos with the stock architecture.
"""
from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import torch
from vllm.model_executor.models.qwen3_vl import (Qwen3VLDummyInputsBuilder, Qwen3VLForConditionalGeneration,
                                                 Qwen3VLMultiModalProcessor, Qwen3VLProcessingInfo)
from vllm.multimodal import MULTIMODAL_REGISTRY
from vllm.multimodal.processing.context import BaseProcessingInfo

from .processing import InfoMixin, ProcessorMixin
from .qwen import QwenModelMixin
from .qwen2_vl import FourChannelPositions


class MiPrunerQwen3VLProcessingInfo(InfoMixin, Qwen3VLProcessingInfo):
    def get_supported_mm_limits(self):
        return {"image": None}  # videos: not covered yet (module docstring)

    def get_supported_mm_processor_kwargs(self):
        # vLLM's `BaseProcessingInfo.get_supported_mm_processor_kwargs` (vllm/multimodal/processing/context.py):
        # `Qwen3VLProcessingInfo`'s adds video aliases to a videos_kwargs scope, which has no video here
        return BaseProcessingInfo.get_supported_mm_processor_kwargs(self)


class MiPrunerQwen3VLMultiModalProcessor(ProcessorMixin, Qwen3VLMultiModalProcessor):
    _mipruner_media = ("image",)


def _as_strip(feature, k: int, merge: int):
    """`feature` (a pruned image of K placeholders) with the grid of a 1 x K strip, for vLLM's
    `Qwen3VLForConditionalGeneration._iter_mm_grid_hw`, which reads `data["image_grid_thw"].data` only."""
    grid = torch.tensor([1, merge, k * merge])
    return dataclasses.replace(feature, data={"image_grid_thw": SimpleNamespace(data=grid)})


@MULTIMODAL_REGISTRY.register_processor(MiPrunerQwen3VLMultiModalProcessor, info=MiPrunerQwen3VLProcessingInfo,
                                        dummy_inputs=Qwen3VLDummyInputsBuilder)
class MiPrunerQwen3VLForConditionalGeneration(QwenModelMixin, FourChannelPositions, Qwen3VLForConditionalGeneration):
    def mipruner_reads(self, emb: torch.Tensor) -> torch.Tensor:
        return emb[:, :self.visual_dim]  # the main rows; the DeepStack blocks follow them (module docstring)

    def get_mrope_input_positions(self, input_tokens, mm_features):
        """vLLM's, with each pruned image (K placeholders, K < N) read as a 1 x K strip: positions of the
        pruned prompt's length, which the runner rewrites from the image on (`recompute_mrope_positions`)."""
        merge = self.config.vision_config.spatial_merge_size
        features = []
        for f in mm_features:
            k = f.mm_position.length
            if f.modality == "image" and f.data is not None and k != int(f.data["image_grid_thw"].data.prod()) // (
                    merge * merge):
                f = _as_strip(f, k, merge)
            features.append(f)
        return super().get_mrope_input_positions(input_tokens, features)
