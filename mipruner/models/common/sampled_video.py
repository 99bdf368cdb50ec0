"""Families whose checkpoint's video config picks the frames (LLaVA-OneVision, InternVL).

A family sets `frame_rule(total, fps, settings, default) -> indices` (its restatement of its video
processor's `sample_frames`) and `video_defaults` (its video processor class's defaults, overridden
by the checkpoint's video_preprocessor_config.json: `video_settings`); a video file is then read with
that rule, images and in-memory clips as every family reads them.
"""
from __future__ import annotations

import os
from typing import Callable

import numpy as np
import torch
from PIL import Image

from ...media import MediaError, is_video_path, load_media, load_video
from .hub_files import video_processor_dict


def video_settings(cfg: dict, defaults: dict) -> dict:
    """`defaults` overridden by the checkpoint's video config; size as {"height", "width"}."""
    s = {k: cfg.get(k, v) for k, v in defaults.items()}
    size = dict(s["size"] or {})
    if "height" not in size:
        edge = size.get("shortest_edge")
        if not edge:
            raise ValueError(f"the video processor's size needs height/width, got {size}")
        size = {"height": edge, "width": edge}
    s["size"] = size
    return s


def frames_asked(total: int, video_fps: float, s: dict, default: int) -> int | None:
    """How many of a `total`-frame video's frames the video config `s` asks for: `num_frames`, or, sampling
    by fps, max(1, int(total / video_fps * fps)); `default` without `do_sample_frames` (transformers would
    read every frame, which overflows the context for any real clip); None when it samples with neither
    (every frame is read)."""
    if not s["do_sample_frames"]:
        return default
    if s["num_frames"] is not None:
        return int(s["num_frames"])
    if s["fps"] is not None:
        if not video_fps:
            raise MediaError("the video does not state its frame rate, which frame sampling by fps needs")
        return max(1, int(total / video_fps * float(s["fps"])))
    return None


def video_pixels(frames: list[Image.Image], s: dict) -> torch.Tensor:
    """(F, 3, H, W) float32: each frame RGB, resized to size, rescaled and normalised."""
    h, w = int(s["size"]["height"]), int(s["size"]["width"])
    arr = np.stack([np.asarray(f.convert("RGB").resize((w, h), resample=int(s["resample"])), dtype=np.float32)
                    for f in frames])  # (F, H, W, 3)
    if s["do_rescale"]:
        arr = arr * np.float32(s["rescale_factor"])
    if s["do_normalize"]:
        arr = (arr - np.asarray(s["image_mean"], np.float32)) / np.asarray(s["image_std"], np.float32)
    return torch.from_numpy(np.ascontiguousarray(arr.transpose(0, 3, 1, 2)))


class SampledVideo:
    """Mixin before `ProcessorAdapter`: `video_config=` at construction, read by `from_pretrained`."""

    default_frames = 8
    frame_rule: Callable[[int, float, dict, int], list[int]]
    video_defaults: dict

    def __init__(self, *args, video_config: dict | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.video = video_settings(video_config or {}, self.video_defaults)

    def _media(self, media):
        if isinstance(media, (str, os.PathLike)) and is_video_path(media):
            rule = type(self).frame_rule
            return load_video(media, sample=lambda total, fps: rule(total, fps, self.video, self.default_frames))
        return load_media(media, num_frames=self.default_frames)

    @classmethod
    def from_pretrained(cls, path: str, device=None, dtype=None, **kwargs):
        return super().from_pretrained(path, device, dtype, video_config=video_processor_dict(str(path)), **kwargs)
