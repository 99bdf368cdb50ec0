"""Every supported family as a random-weight model, and the media each one takes: the gpu check's table.

`FAMILIES[name]` is a `Family`: `build(tiny=, device=, dtype=, seed=, llm_layers=None) -> (adapter,
description)` builds the model on `device` (real shapes: the 7B / 2B-3B checkpoints' configs, restated in
the random_* modules; tiny=True: a few layers of small width, for CPU runs; llm_layers: the LLM's depth
instead of the config's, e.g. the real towers, processors, widths and vocabularies with 2 decoder layers
on a CPU), and `media` names what its adapter reads:
  image    one picture (non-square, so LLaVA-NeXT / OneVision pick a wide grid);
  images   several pictures in one prompt, where the adapter takes a list of images as images
           (LLaVA-1.5: one <image> each; LLaVA-OneVision: one base view each). Qwen adapters read a
           list as a video's frames, Video-LLaVA as a video, LLaVA-NeXT takes one image only;
  video    `video_frames` frames (8) as a `mipruner.media.Video`. LLaVA-1.5 reads each frame as its own
           image (576 tokens each at full size), so it gets 4: 8 frames would be 4,608 tokens, past
           its 4,096-position context, where the in-LLM methods refuse the prompt.
`make_media(kind, tiny, frames)` returns that input. Adding a family is one line in `FAMILIES` (a builder
with the same keyword signature, its title and its media).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
from PIL import Image

MEDIA = ("image", "images", "video")
# LLaVA-1.5 / NeXT: tiny widths as `bench gpu --tiny`, 2 Llama layers drawn with std 0.2 (answers that
# depend on the kept tokens); real: LLaVA-1.5-7B's tower, all 32 Llama-7B layers and its 32,064-row
# vocabulary (llava-hf/llava-1.5-7b-hf's config.json; the word-level tokenizer uses the first few rows).
LLAVA_TINY = dict(image_size=56, patch=14, vision_layers=2, vision_width=64, llm_layers=2, llm_width=128, llm_ffn=256,
                  text_init=0.2)
LLAVA_REAL = dict(llm_layers=32, vocab_size=32064)


def _llava(family: str) -> Callable:
    def build(*, tiny: bool, device, dtype, seed: int = 0, llm_layers: int | None = None):
        from mipruner.models.llava.random_weights import build_random_llava

        shape = dict(LLAVA_TINY if tiny else LLAVA_REAL)
        if llm_layers:
            shape["llm_layers"] = llm_layers
        return build_random_llava(family=family, device=device, dtype=dtype, seed=seed, **shape)
    return build


def _module(module: str, fn: str = "build") -> Callable:
    def build(*, tiny: bool, device, dtype, seed: int = 0, llm_layers: int | None = None):
        import importlib

        return getattr(importlib.import_module(f"mipruner.models.{module}"), fn)(tiny=tiny, device=device, dtype=dtype,
                                                                                 seed=seed, llm_layers=llm_layers)
    return build


@dataclass(frozen=True)
class Family:
    """name: the adapter family (config model_type); title: for people; build: the random model;
    media: the kinds of input (of MEDIA) its adapter takes; video_frames: frames of its video."""

    name: str
    title: str
    build: Callable
    media: tuple[str, ...]
    video_frames: int = 8

    def __post_init__(self):
        bad = [m for m in self.media if m not in MEDIA]
        if bad or not self.media:
            raise ValueError(f"{self.name}: media must be some of {MEDIA}, got {self.media}")


FAMILIES: dict[str, Family] = {f.name: f for f in [
    Family("llava", "LLaVA-1.5-7B", _llava("llava"), ("image", "images", "video"), video_frames=4),
    Family("llava_next", "LLaVA-NeXT-7B", _llava("llava_next"), ("image",)),
    Family("video_llava", "Video-LLaVA-7B", _module("llava.random_video_llava"), ("image", "video")),
    Family("qwen2_vl", "Qwen2-VL-2B", _module("qwen.random_weights", "build_qwen2_vl"), ("image", "video")),
    Family("qwen2_5_vl", "Qwen2.5-VL-3B", _module("qwen.random_weights", "build_qwen2_5_vl"), ("image", "video")),
    Family("qwen3_vl", "Qwen3-VL-2B", _module("qwen.random_weights", "build_qwen3_vl"), ("image", "video")),
    Family("llava_onevision", "LLaVA-OneVision-7B", _module("onevision.random_weights"), ("image", "images", "video")),
    Family("internvl", "InternVL3-8B", _module("internvl.random_weights"), ("image", "images", "video")),
]}


def get_family(name: str) -> Family:
    if name not in FAMILIES:
        raise ValueError(f"unknown family {name!r}; choose from {', '.join(FAMILIES)}")
    return FAMILIES[name]


def picture(width: int, height: int, seed: int = 0) -> Image.Image:
    """Seeded noise with a red square in the upper left quarter (what the prompts ask about)."""
    a = np.random.default_rng(seed).integers(0, 255, size=(height, width, 3), dtype=np.uint8)
    a[height // 4: height // 2, width // 4: width // 2] = (220, 30, 30)
    return Image.fromarray(a)


def make_media(kind: str, tiny: bool, frames: int = 8):
    """The input of `kind`: 448 x 336 pictures (tiny: 112 x 84), 2 of them for "images", `frames`
    frames for "video"."""
    from mipruner.media import Video

    w, h = (112, 84) if tiny else (448, 336)
    if kind == "image":
        return picture(w, h)
    if kind == "images":
        return [picture(w, h, seed=1), picture(h, w, seed=2)]
    if kind == "video":
        pics = [picture(w, h, seed=10 + i) for i in range(frames)]
        return Video(frames=pics, indices=list(range(frames)), fps=4.0, total_frames=frames)
    raise ValueError(f"unknown media {kind!r}; choose from {MEDIA}")


PROMPTS = {"image": "what is in the image? describe the red square.",
           "images": "what is in the image? describe the red square.",
           "video": "what is in the video? describe the red square."}
