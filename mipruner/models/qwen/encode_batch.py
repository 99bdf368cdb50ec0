"""Several Qwen-VL items encoded with ONE vision-tower call for their single images.

Qwen's ViT takes any number of images as one sequence of patches with their `image_grid_thw` (each
image attends only to itself: `cu_seqlens`), and `get_image_features` returns each image's merged
tokens apart (`pooler_output`, one tensor an image; Qwen3-VL's deepstack features likewise, a layer
at a time). So a batch of items, each one image
at its own native resolution, needs no common pixel shape: their processor outputs are concatenated,
the tower runs once, and each item's `encode` takes its share (`Qwen2VLAdapter._encode(..., held=...)`). The
encodings equal the one-by-one encodings up to float rounding of the bigger matrix products
(tests/models/test_encode_batch.py). Videos and lists of frames are encoded one by one, and so is
every item when the encoding records anything of the tower (attention, keys, other blocks,
per-head maps, features: those hooks see one image's sequence at a time).
"""
from __future__ import annotations

import os

import torch

from ...media import Video, is_video_path
from ...pruners.signals import Signals
from ..base import Encoded


def _one_image(media) -> bool:
    """Whether `media` is one image (not a `Video`, a list of frames or a video file), judged without reading it."""
    if isinstance(media, (Video, list, tuple)):
        return False
    return not (isinstance(media, (str, os.PathLike)) and is_video_path(media))


def _share(feats, j: int, counts: list[int]):
    """Image j's part of a batched `get_image_features` output."""
    kw = {"pooler_output": (feats.pooler_output[j],)}
    deep = getattr(feats, "deepstack_features", None)
    if deep is not None:  # Qwen3-VL: a layer's features split per image (or one tensor over all images)
        kw["deepstack_features"] = [(layer.split(counts) if torch.is_tensor(layer) else layer)[j:j + 1]
                                    for layer in deep]
    return type(feats)(**kw)


@torch.no_grad()
def encode_batch(adapter, items, *, text_mode: str = "question", need_attention: bool = False,
                 signals: Signals | None = None) -> list[Encoded]:
    """`adapter.encode` of each (media, prompt) item, in order; the items that are one image each share one
    tower call when the encoding records nothing of the tower (module docstring)."""
    items = list(items)
    want = Signals.of(need_attention, signals)
    held: dict = {}
    if not (want.attention or want.extra):
        singles = []
        for i, (media, prompt) in enumerate(items):
            if _one_image(media):
                image = adapter._read_media(media)[0][0]  # read once: its encode below gets the image itself
                items[i] = (image, prompt)
                singles.append((i, adapter.image_processor(images=[image], return_tensors="pt")))
        if len(singles) > 1:
            device = adapter.model.device
            pixels = torch.cat([o["pixel_values"] for _, o in singles]).to(device)
            grids = torch.cat([o["image_grid_thw"] for _, o in singles])
            feats = adapter.model.get_image_features(pixels, grids.to(device), return_dict=True)
            counts = (grids.prod(-1) // adapter.merge ** 2).tolist()  # each image's tokens (host: the grids)
            for j, (i, out) in enumerate(singles):
                held[i] = (out, _share(feats, j, counts))
    return [adapter._encode(media, prompt, text_mode=text_mode, need_attention=need_attention, signals=signals,
                            held=held.get(i)) for i, (media, prompt) in enumerate(items)]


__all__ = ["encode_batch"]
