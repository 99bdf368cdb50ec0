"""Qwen2-VL in vLLM with mipruner's pruning of images and videos: the same worker as Qwen2.5-VL's
(`qwen.QwenModelMixin`: K merged tokens per image or video, each with its unpruned (t, h, w) column and
the media's extent as 4 extra channels), on vLLM's `Qwen2VLForConditionalGeneration`.

vLLM 0.32's Qwen2-VL (vllm/model_executor/models/qwen2_vl.py) does not implement
`SupportsMultiModalPruning` (vllm/model_executor/models/interfaces.py), whose `recompute_mrope_positions`
the runner calls on every prefill once its multimodal-pruning flag is on (`runner.enable_position_recompute`
sets it for this class). The class below implements it with vLLM's public
`vllm.multimodal.video_prune.evs.recompute_mrope_positions`, the function qwen2_5_vl.py's
`Qwen2_5_VLForConditionalGeneration.recompute_mrope_positions` calls: it strips the 4 channels and places the
kept tokens at their unpruned columns, the text after the media where it is without pruning.

Qwen2-VL's temporal positions are the token-frame index (no `tokens_per_second`, no
`second_per_grid_ts`: vLLM's `Qwen2VLForConditionalGeneration.iter_mm_grid_thw` uses a factor of 1, as
transformers' `Qwen2VLModel.get_rope_index` does), so the mixin's `compute_mrope_for_media` gets 1 and 1.
vLLM has no EVS of its own for Qwen2-VL: `--video-pruning-rate` changes nothing on this model (as on the
stock one), so the front end does not refuse `mipruner_method` on its videos.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
from vllm.model_executor.models.interfaces import SupportsMultiModalPruning
from vllm.model_executor.models.qwen2_vl import (Qwen2VLDummyInputsBuilder, Qwen2VLForConditionalGeneration,
                                                 Qwen2VLMultiModalProcessor, Qwen2VLProcessingInfo)
from vllm.multimodal import MULTIMODAL_REGISTRY
from vllm.multimodal.video_prune.evs import recompute_mrope_positions
from vllm.utils.gpu_sync_debug import gpu_sync_allowed

from .processing import InfoMixin, ProcessorMixin
from .qwen import QwenModelMixin


class MiPrunerQwen2VLProcessingInfo(InfoMixin, Qwen2VLProcessingInfo):
    pass


class MiPrunerQwen2VLMultiModalProcessor(ProcessorMixin, Qwen2VLMultiModalProcessor):
    _mipruner_media = ("image", "video")


class FourChannelPositions:
    """`SupportsMultiModalPruning.recompute_mrope_positions` over the mixin's 4 channels (t, h, w, extent), with
    vLLM's public `vllm.multimodal.video_prune.evs.recompute_mrope_positions`: this class's, and Qwen3-VL's
    images' (`qwen3_vl.py`: vLLM's 5-channel method there would start the text after a pruned image at its
    largest kept position + 1, not where it is without pruning)."""

    def recompute_mrope_positions(self, input_ids: list[int] | torch.Tensor,
                                  multimodal_embeddings: Sequence[torch.Tensor], mrope_positions: torch.LongTensor,
                                  num_computed_tokens: int) -> tuple[Sequence[torch.Tensor], torch.Tensor, int]:
        """`SupportsMultiModalPruning.recompute_mrope_positions`: (the embeddings without their 4 position
        channels, the prompt's (3, L) M-RoPE positions from `num_computed_tokens` on, the new position delta)."""
        device = multimodal_embeddings[0].device if len(multimodal_embeddings) else mrope_positions.device
        ids = torch.as_tensor(input_ids, dtype=torch.long, device=device)
        rows = [mm[:, :-4] for mm in multimodal_embeddings]
        columns = [mm[:, -4:].permute(1, 0).long() for mm in multimodal_embeddings]  # (4, K): t, h, w, extent
        c = self.config
        with gpu_sync_allowed():  # the function reads counts on the host (vLLM's own call site does the same)
            positions, delta = recompute_mrope_positions(ids, columns, mrope_positions, num_computed_tokens,
                                                         c.vision_start_token_id, c.image_token_id, c.video_token_id)
        return rows, positions, delta


@MULTIMODAL_REGISTRY.register_processor(MiPrunerQwen2VLMultiModalProcessor, info=MiPrunerQwen2VLProcessingInfo,
                                        dummy_inputs=Qwen2VLDummyInputsBuilder)
class MiPrunerQwen2VLForConditionalGeneration(QwenModelMixin, FourChannelPositions, Qwen2VLForConditionalGeneration,
                                              SupportsMultiModalPruning):
    # vLLM's video pruning methods this model runs itself: none (vLLM's ModelConfig then checks no
    # --video-pruning-method against it, as for the stock Qwen2-VL, which declares none).
    supported_video_pruning_methods = ()
