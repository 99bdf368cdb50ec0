"""Qwen3-VL adapter: the Qwen2-VL adapter plus DeepStack, timestamped video prompts, 3-D resize.

DeepStack: the ViT's intermediate features (one (N_V, d) tensor per injected decoder layer) are
added to the visual positions of the first decoder layers. Pruning keeps the same rows of every
deepstack tensor; the model rebuilds the visual position mask from the pruned `input_ids`, so
both travel through the public `mm_encoder_outputs` input (`deepstack_features`).

Videos: each token-frame gets its own "<t seconds><|vision_start|>...<|vision_end|>" block in the
prompt (as Qwen3VLProcessor does), and the resize budget covers all frames (t * h * w).
"""
from __future__ import annotations

import math

import torch

from ..media import MediaError
from .base import Encoded
from .qwen2_vl import Qwen2VLAdapter


def smart_resize_3d(num_frames: int, height: int, width: int, temporal_factor: int, factor: int,
                    min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """Qwen3-VL video resize rule: like Qwen2-VL's, with the pixel budget over t * h * w."""
    if height < factor or width < factor:
        scale = max(factor / height, factor / width)
        height, width = int(height * scale), int(width * scale)
    if max(height, width) / min(height, width) > 200:
        raise MediaError(f"aspect ratio must be below 200, got {max(height, width) / min(height, width):.0f}")
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    t_bar = round(num_frames / temporal_factor) * temporal_factor
    if t_bar * h_bar * w_bar > max_pixels:
        beta = math.sqrt((num_frames * height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif t_bar * h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (num_frames * height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def frame_timestamps(indices: list[int], fps: float, temporal: int) -> list[float]:
    """Seconds of each token-frame: mean time of the first and last frame of its temporal patch."""
    indices = list(indices) + [indices[-1]] * (-len(indices) % temporal)
    seconds = [i / fps for i in indices]
    return [(seconds[i] + seconds[i + temporal - 1]) / 2 for i in range(0, len(seconds), temporal)]


class Qwen3VLAdapter(Qwen2VLAdapter):
    family = "qwen3_vl"
    default_video_fps = 24.0  # what Qwen3VLProcessor assumes for frames without metadata

    def num_frames(self, total: int, video_fps: float) -> int:
        """Qwen3-VL video processor rule: int(duration * fps) clamped to [min_frames, max_frames, total]."""
        vc = self.video_config
        if vc["num_frames"]:
            return max(1, min(total, int(vc["num_frames"])))
        video_fps = video_fps or self.default_video_fps
        n = int(total / video_fps * vc["fps"]) if vc["fps"] else total
        return max(1, min(max(n, vc["min_frames"]), vc["max_frames"], total))

    def video_resize_target(self, num_frames: int, height: int, width: int) -> tuple[int, int]:
        vc = self.video_config
        return smart_resize_3d(num_frames, height, width, self.temporal, self.patch * self.merge,
                               vc["min_pixels"], vc["max_pixels"])

    def _expand_video_text(self, text: str, grid: torch.Tensor, indices: list[int], fps: float) -> str:
        tok = self.tokenizer
        start = tok.convert_ids_to_tokens(self.config.vision_start_token_id)
        end = tok.convert_ids_to_tokens(self.config.vision_end_token_id)
        per_frame = int(grid[0, 1:].prod()) // self.merge ** 2
        stamps = frame_timestamps(indices, fps or self.default_video_fps, self.temporal)
        block = "".join(f"<{s:.1f} seconds>{start}{self.video_token * per_frame}{end}"
                        for s in stamps[: int(grid[0, 0])])
        return text.replace(self.video_token, block, 1)

    def _extra_state(self, feats, state: dict) -> None:
        # one (N_V, d) tensor per deepstack layer, rows in LLM order
        state["deepstack"] = [torch.cat(f, dim=0).detach() for f in feats.deepstack_features]

    def _encoder_outputs(self, encoded: Encoded, rows: torch.Tensor, idx: torch.Tensor):
        from transformers.models.qwen3_vl.modeling_qwen3_vl import BaseModelOutputWithDeepstackFeatures
        device = self.model.device
        deepstack = [(f[idx].to(device),) for f in encoded.state["deepstack"]]  # pruned with the same rows
        return BaseModelOutputWithDeepstackFeatures(pooler_output=(rows.to(device),), deepstack_features=deepstack)


__all__ = ["Qwen3VLAdapter", "frame_timestamps", "smart_resize_3d"]
