"""What Qwen2-VL, Qwen2.5-VL and Qwen3-VL read from a video, as transformers' video processors do,
without torchvision (their video processors import it, so they cannot be built here).

Our own code, written from transformers 5.x `models/qwen2_vl/video_processing_qwen2_vl.py`
(`Qwen2VLVideoProcessor`: class defaults, `__init__`, `sample_frames`, `resize`, `patchify`; Qwen2.5-VL
uses the same class) and `models/qwen3_vl/video_processing_qwen3_vl.py` (`Qwen3VLVideoProcessor`,
its module-level `smart_resize`), and from `video_processing_utils.BaseVideoProcessor.get_video_processor_dict`
(which file holds the settings: `common.hub_files.video_processor_dict`). tests/models/test_qwen_video.py
runs the installed transformers functions against these.

  settings  the official class's defaults, updated from the checkpoint's files in transformers'
            order: the "video_processor" entry of processor_config.json, else
            video_preprocessor_config.json, else preprocessor_config.json (the image processor's).
  frames    only when `do_sample_frames` is on (Qwen3-VL's default; not Qwen2-VL's, which then reads
            every frame): Qwen2-VL rounds the count to the temporal patch (fps rule: duration * fps
            clamped to [min_frames, max_frames, frames]) and takes torch.arange(0, n, n / k).int();
            Qwen3-VL takes int(duration * fps) clamped likewise, at np.linspace(0, n - 1, k).round().
  resize    Qwen2-VL: `smart_resize` per frame; Qwen3-VL: `smart_resize_3d`, the pixel budget over
            the real number of frames t (not t padded to the temporal patch), refusing t < T as the
            official one does; `cap_pixels_per_frame` as the official `resize`.
  pixels    frames resized with PIL to that target, rescaled/normalised by the PIL image processor
            (do_resize=False), regrouped into the official `patchify` layout.

Deliberate deviations: PIL resizes where the official processor uses torchvision's bicubic, so
pixels differ by interpolation rounding (layout, grids and token counts are the same). Where
Qwen2-VL's `sample_frames` fails (a 1-frame clip under the fps rule: it divides by zero; sampling on
with neither fps nor num_frames: it compares None), every frame is read, which is what the
processor does with `do_sample_frames` off.
"""
from __future__ import annotations

import math
import os

import numpy as np
import torch

from ...media import MediaError, Video, is_video_path, load_image, load_video
from ..common.hub_files import read_json, video_processor_dict

OPENAI_CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]
OPENAI_CLIP_STD = [0.26862954, 0.26130258, 0.27577711]
BICUBIC = 3

# Qwen2VLVideoProcessor's class attributes (Qwen2.5-VL uses the same class)
QWEN2_DEFAULTS = dict(
    size={"shortest_edge": 128 * 28 * 28, "longest_edge": 28 * 28 * 768}, image_mean=OPENAI_CLIP_MEAN,
    image_std=OPENAI_CLIP_STD, resample=BICUBIC, do_rescale=True, rescale_factor=1 / 255, do_normalize=True,
    patch_size=14, temporal_patch_size=2, merge_size=2, min_frames=4, max_frames=768, do_sample_frames=False,
    fps=None, num_frames=None, cap_pixels_per_frame=None, max_video_tokens=128000)
# Qwen3VLVideoProcessor's
QWEN3_DEFAULTS = dict(
    QWEN2_DEFAULTS, size={"shortest_edge": 128 * 32 * 32, "longest_edge": 32 * 32 * 768},
    image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5], patch_size=16, do_sample_frames=True, fps=2,
    max_video_tokens=768)


def video_settings(cfg: dict, qwen3: bool) -> dict:
    """The official class's defaults updated from `cfg`; Qwen2-VL's min/max_pixels override `size`."""
    defaults = QWEN3_DEFAULTS if qwen3 else QWEN2_DEFAULTS
    s = {k: cfg.get(k, v) for k, v in defaults.items()}
    s["size"] = dict(cfg.get("size") or defaults["size"])
    if not qwen3:  # Qwen2VLVideoProcessor.__init__
        if cfg.get("min_pixels") is not None:
            s["size"]["shortest_edge"] = cfg["min_pixels"]
        if cfg.get("max_pixels") is not None:
            s["size"]["longest_edge"] = cfg["max_pixels"]
    for key in ("shortest_edge", "longest_edge"):
        if not s["size"].get(key):
            raise ValueError(f"the video processor's size needs {key!r}, got {s['size']}")
    return s


def _check_exclusive(s: dict) -> None:
    if s["fps"] is not None and s["num_frames"] is not None:
        raise MediaError("the video processor config sets both fps and num_frames; they are mutually exclusive")


def qwen2_indices(total: int, video_fps: float, s: dict) -> list[int]:
    """Frames Qwen2-VL / Qwen2.5-VL read from a `total`-frame video at `video_fps`."""
    if not s["do_sample_frames"]:
        return list(range(total))
    _check_exclusive(s)
    t, n = int(s["temporal_patch_size"]), s["num_frames"]
    if n is not None:
        n = round(n / t) * t
    elif s["fps"] is not None:
        if not video_fps:
            raise MediaError("the video does not state its frame rate, which frame sampling by fps needs")
        cap = math.floor(min(s["max_frames"], total) / t) * t
        n = min(max(total / video_fps * s["fps"], s["min_frames"]), cap, total)
        n = math.floor(n / t) * t
    else:
        return list(range(total))
    if n > total:
        raise MediaError(f"the video processor asks for {n} frames of a {total}-frame video")
    if n == 0:  # shorter than one temporal patch: transformers divides by zero here
        return list(range(total))
    return torch.arange(0, total, total / n).int().tolist()


def qwen3_indices(total: int, video_fps: float, s: dict) -> list[int]:
    """Frames Qwen3-VL reads from a `total`-frame video at `video_fps` (24 when unknown, as there)."""
    if not s["do_sample_frames"]:
        return list(range(total))
    _check_exclusive(s)
    n = s["num_frames"]
    if n is None and s["fps"] is not None:
        n = int(total / (video_fps or 24) * s["fps"])
        n = min(max(n, s["min_frames"]), s["max_frames"], total)
    if n is None:
        n = min(max(total, s["min_frames"]), s["max_frames"])
    return np.linspace(0, total - 1, n).round().astype(int).tolist()


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """Qwen2-VL's resize rule: sides divisible by `factor`, area within [min, max], aspect kept."""
    if max(height, width) / min(height, width) > 200:
        raise MediaError(f"aspect ratio must be below 200, got {max(height, width) / min(height, width):.0f}")
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def smart_resize_3d(num_frames: int, height: int, width: int, temporal_factor: int, factor: int,
                    min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """Qwen3-VL's video resize rule: Qwen2-VL's with the pixel budget over t * h * w."""
    if num_frames < temporal_factor:
        raise MediaError(f"Qwen3-VL reads videos of at least {temporal_factor} frames, got {num_frames} "
                         "(give a single frame as an image)")
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


def resize_target(num_frames: int, height: int, width: int, s: dict, factor: int, temporal: int,
                  qwen3: bool) -> tuple[int, int]:
    """(height, width) every frame of a `num_frames`-frame video is resized to."""
    lo, hi = int(s["size"]["shortest_edge"]), int(s["size"]["longest_edge"])
    if not qwen3:
        if s["cap_pixels_per_frame"]:  # even share of max_video_tokens, floored at 1.05 * min
            total_pixels = int(s["max_video_tokens"] * factor * factor * 0.9)
            hi = max(min(hi, total_pixels * temporal // num_frames), int(lo * 1.05))
        return smart_resize(height, width, factor, lo, hi)
    if s["cap_pixels_per_frame"]:
        per_frame = max(min(s["max_video_tokens"] * factor * factor, hi // num_frames), int(lo * 1.05))
        hi = per_frame * num_frames
    return smart_resize_3d(num_frames, height, width, temporal, factor, lo, hi)


def video_pixels(frames, target: tuple[int, int], s: dict, image_processor, patch: int, merge: int,
                 temporal: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Frames -> (pixel_values_videos (T' * gh * gw, C * T * p * p), video_grid_thw (1, 3)).

    Layout of the official `patchify`: (grid_t, gh/m, gw/m, m, m, C, T, p, p), the frames padded to a
    multiple of T with the last one.
    """
    t, p, m = temporal, patch, merge
    frames = list(frames) + [frames[-1]] * (-len(frames) % t)
    rh, rw = target
    resized = [f.convert("RGB").resize((rw, rh), resample=int(s["resample"])) for f in frames]
    out = image_processor(images=resized, do_resize=False, do_rescale=s["do_rescale"],
                          rescale_factor=s["rescale_factor"], do_normalize=s["do_normalize"],
                          image_mean=s["image_mean"], image_std=s["image_std"], patch_size=p, merge_size=m,
                          temporal_patch_size=t, return_tensors="pt")
    gh, gw = rh // p, rw // p
    c = out["pixel_values"].shape[1] // (t * p * p)
    # the image processor repeats each frame T times along its temporal axis: keep slot 0
    per_frame = out["pixel_values"].view(len(frames), gh // m, gw // m, m, m, c, t, p, p)[..., 0, :, :]
    grid_t = len(frames) // t
    video = per_frame.view(grid_t, t, gh // m, gw // m, m, m, c, p, p)
    video = video.permute(0, 2, 3, 4, 5, 6, 1, 7, 8)  # (grid_t, gh/m, gw/m, m, m, C, T, p, p)
    pixels = video.reshape(grid_t * gh * gw, c * t * p * p).contiguous()
    return pixels, torch.tensor([[grid_t, gh, gw]])


def read_media(media, sample_frames) -> tuple[list, bool, list[int], float, int]:
    """(frames, is_video, sampled frame indices, video fps (0 = unknown), frames in the stream) of `media`.

    A `Video` or a list of frames is taken as already sampled (the official processor given decoded frames
    with `do_sample_frames` off); a video file is sampled by `sample_frames(total, fps)`."""
    if isinstance(media, Video):
        return media.frames, True, list(media.indices), media.fps, media.total_frames
    if isinstance(media, (list, tuple)):
        if not media:
            raise MediaError("an empty list of frames")
        return [load_image(f) for f in media], True, list(range(len(media))), 0.0, len(media)
    if isinstance(media, (str, os.PathLike)) and is_video_path(media):
        video = load_video(media, sample=sample_frames)
        return video.frames, True, list(video.indices), video.fps, video.total_frames
    return [load_image(media)], False, [0], 0.0, 1


def decoded(media, sample_frames):
    """`media` with its file decoded: a video file as the `Video` `read_media` samples of it, an image file as its
    image; anything else as it is (`read_media` of the result equals `read_media` of `media`)."""
    if isinstance(media, (str, os.PathLike)):
        return load_video(media, sample=sample_frames) if is_video_path(media) else load_image(media)
    return media


__all__ = ["decoded", "read_media", "QWEN2_DEFAULTS", "QWEN3_DEFAULTS", "qwen2_indices", "qwen3_indices", "read_json", "resize_target",
           "smart_resize", "smart_resize_3d", "video_pixels", "video_processor_dict", "video_settings"]
