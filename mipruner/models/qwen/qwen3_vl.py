"""Qwen3-VL adapter: the Qwen2-VL adapter plus DeepStack, timestamped video prompts, 3-D resize.

DeepStack: the ViT's intermediate features (one (N_V, d) tensor per injected decoder layer) are
added to the visual positions of the first decoder layers. Pruning keeps the same rows of every
deepstack tensor; the model rebuilds the visual position mask from the pruned `input_ids`, so
both travel through the public `mm_encoder_outputs` input (`deepstack_features`).

Videos: each token-frame gets its own "<t seconds><|vision_start|>...<|vision_end|>" block in the
prompt (as Qwen3VLProcessor does); which frames are read and the resize target (pixel budget over
t * h * w, t the real number of frames) follow Qwen3VLVideoProcessor (`video.py`).
"""
from __future__ import annotations

import torch

from . import video as QV
from .video import smart_resize_3d
from ..base import Encoded
from .qwen2_vl import Qwen2VLAdapter


def frame_timestamps(indices: list[int], fps: float, temporal: int) -> list[float]:
    """Seconds of each token-frame: mean time of the first and last frame of its temporal patch."""
    indices = list(indices) + [indices[-1]] * (-len(indices) % temporal)
    seconds = [i / fps for i in indices]
    return [(seconds[i] + seconds[i + temporal - 1]) / 2 for i in range(0, len(seconds), temporal)]


class Qwen3VLAdapter(Qwen2VLAdapter):
    family = "qwen3_vl"
    qwen3 = True
    default_video_fps = 24.0  # what Qwen3VLProcessor assumes for frames without metadata

    def sample_frames(self, total: int, video_fps: float) -> list[int]:
        """Qwen3VLVideoProcessor.sample_frames: int(duration * fps) frames at np.linspace(...).round()."""
        return QV.qwen3_indices(total, video_fps, self.video_config)

    def _expand_video_text(self, text: str, grid: torch.Tensor, indices: list[int], fps: float) -> str:
        tok = self.tokenizer
        start = tok.convert_ids_to_tokens(self.config.vision_start_token_id)
        end = tok.convert_ids_to_tokens(self.config.vision_end_token_id)
        per_frame = int(grid[0, 1:].prod()) // self.merge ** 2
        stamps = frame_timestamps(indices, fps or self.default_video_fps, self.temporal)
        block = "".join(f"<{s:.1f} seconds>{start}{self.video_token * per_frame}{end}"
                        for s in stamps[: int(grid[0, 0])])
        return text.replace(self.video_token, block, 1)

    def _extra_state(self, feats, state) -> None:
        # one (N_V, d) tensor per deepstack layer, rows in LLM order
        state.deepstack = [torch.cat(f, dim=0).detach() for f in feats.deepstack_features]

    def _encoder_outputs(self, encoded: Encoded, rows: torch.Tensor, idx: torch.Tensor):
        from transformers.models.qwen3_vl.modeling_qwen3_vl import BaseModelOutputWithDeepstackFeatures
        device = self.model.device
        deepstack = [(f[idx].to(device),) for f in encoded.state.deepstack]  # pruned with the same rows
        return BaseModelOutputWithDeepstackFeatures(pooler_output=(rows.to(device),), deepstack_features=deepstack)


__all__ = ["Qwen3VLAdapter", "frame_timestamps", "smart_resize_3d"]
