"""Every supported family as a random-weight model, and the media each one takes: the gpu check's table.

`FAMILIES` is the family table (`mipruner.models.families`, where the media kinds are described), one
`Family` per config model_type: `build(tiny=, device=, dtype=, seed=, llm_layers=None) -> (adapter,
description)` builds the model on `device` (real shapes: the 7B / 2B-3B checkpoints' configs, restated in
each family folder's random-weight module; tiny=True: a few layers of small width, for CPU runs;
llm_layers: the LLM's depth instead of the config's, e.g. the real towers, processors, widths and
vocabularies with 2 decoder layers on a CPU), and `media` names what its adapter reads (image, images,
video of `video_frames` frames). `make_media(kind, tiny, frames)` returns that input. Adding a family is
its line in the family table; nothing here changes.
"""
from __future__ import annotations

import numpy as np
from PIL import Image

from mipruner.models.families import FAMILIES, MEDIA, Family, get_family


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


__all__ = ["FAMILIES", "MEDIA", "PROMPTS", "Family", "get_family", "make_media", "picture"]
