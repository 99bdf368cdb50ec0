"""transformers processors built by their own constructor, with frames the adapter prepared in their video slot.

The hub's InternVL and LLaVA-OneVision checkpoints name video processors that import torchvision, which
this package does not need. Their processors' constructors check each part's class, and the video
slot's class (`VideoProcessorMixin`) is exported by transformers only when torchvision is installed.
`build_processor(cls, ...)` calls `cls`'s own `__init__` on the checkpoint's parts with a `PreparedFrames`
in the video slot, through a subclass whose `check_argument_for_proper_class` accepts that one object in
that one slot (every other part is checked as transformers checks it; nothing of `cls` is replaced).
"""
from __future__ import annotations

import functools

import torch


class PreparedFrames:
    """A processor's video slot: frames the adapter already sampled, resized and normalised, (F, 3, H, W)
    tensors, handed over as `pixel_values_videos`."""

    def __call__(self, videos, **kwargs):
        from transformers.feature_extraction_utils import BatchFeature

        return BatchFeature({"pixel_values_videos": torch.stack(list(videos))})


@functools.cache
def _accepting_frames(cls):
    class Processor(cls):
        def check_argument_for_proper_class(self, argument_name, argument):
            if argument_name == "video_processor" and isinstance(argument, PreparedFrames):
                return PreparedFrames
            return super().check_argument_for_proper_class(argument_name, argument)

    Processor.__name__ = Processor.__qualname__ = cls.__name__
    return Processor


def build_processor(cls, **parts):
    """`cls(video_processor=PreparedFrames(), **parts)`: the processor's own constructor."""
    return _accepting_frames(cls)(video_processor=PreparedFrames(), **parts)


__all__ = ["PreparedFrames", "build_processor"]
