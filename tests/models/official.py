"""transformers' own pipeline as the reference for the adapters, on a machine without torchvision.

Images go through the official processor classes and `apply_chat_template` unchanged. Three of
them (VideoLlavaProcessor, Qwen2VLProcessor / Qwen2_5_VLProcessor / Qwen3VLProcessor) refuse to be
built without their video processor, which imports torchvision; `processor_class` subclasses them
only to accept a stand-in in that slot (nothing of theirs is replaced). For videos the stand-in is
`VideoFunctions`: transformers' own functions composed as the official video processor composes
them: `video_utils.load_video(backend="pyav")` with the official `sample_frames`, the official
resize rule, rescale/normalise, and the official `patchify`. The video processor modules cannot be
imported without torchvision (Qwen2-VL's imports it at the top; the others resolve to placeholders),
so `installed` compiles the needed function from the installed transformers source file itself;
the one step that is not transformers' code is the resize, done with PIL where the official
processor uses torchvision (the same in our adapters, documented there).
"""
from __future__ import annotations

import ast
import functools
import logging
import math
import os
import textwrap
from types import SimpleNamespace

import numpy as np
import torch
from PIL import Image


@functools.cache
def installed(relpath: str, qualname: str):
    """The function `qualname` ("Class.method" or "function") of the installed transformers file
    `relpath`, compiled from its source text."""
    import transformers
    from transformers.video_utils import VideoMetadata

    path = os.path.join(os.path.dirname(transformers.__file__), relpath)
    with open(path) as f:
        src = f.read()
    node = ast.parse(src)
    for part in qualname.split("."):
        node = next(n for n in node.body if isinstance(n, (ast.ClassDef, ast.FunctionDef)) and n.name == part)
    ns = {"math": math, "np": np, "torch": torch, "VideoMetadata": VideoMetadata,
          "logger": logging.getLogger("transformers")}
    code = "\n" * (node.lineno - 1) + textwrap.dedent(ast.get_source_segment(src, node))  # real line numbers
    exec(compile(code, path, "exec"), ns)
    return ns[node.name]


def class_attributes(relpath: str, cls: str) -> dict:
    """`name = value` assignments in the body of class `cls` of an installed transformers file."""
    import transformers
    from transformers.image_utils import (IMAGENET_STANDARD_MEAN, IMAGENET_STANDARD_STD, OPENAI_CLIP_MEAN,
                                          OPENAI_CLIP_STD, PILImageResampling)

    path = os.path.join(os.path.dirname(transformers.__file__), relpath)
    with open(path) as f:
        tree = ast.parse(f.read())
    body = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls).body
    ns = dict(OPENAI_CLIP_MEAN=OPENAI_CLIP_MEAN, OPENAI_CLIP_STD=OPENAI_CLIP_STD, PILImageResampling=PILImageResampling,
              IMAGENET_STANDARD_MEAN=IMAGENET_STANDARD_MEAN, IMAGENET_STANDARD_STD=IMAGENET_STANDARD_STD)
    out = {}
    for n in body:
        if isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name):
            try:
                out[n.targets[0].id] = eval(compile(ast.Expression(n.value), path, "eval"), ns)
            except NameError:
                continue
    return out


QWEN2_VIDEO = "models/qwen2_vl/video_processing_qwen2_vl.py"
INTERNVL_VIDEO = "models/internvl/video_processing_internvl.py"
QWEN3_VIDEO = "models/qwen3_vl/video_processing_qwen3_vl.py"


@functools.cache
def processor_class(cls):
    """`cls` accepting anything (or None) as its video processor."""
    class WithStandIn(cls):
        def check_argument_for_proper_class(self, argument_name, argument):
            if argument_name == "video_processor":
                return type(argument)
            return super().check_argument_for_proper_class(argument_name, argument)

    WithStandIn.__name__ = cls.__name__
    return WithStandIn


class VideoFunctions:
    """Stand-in for a video processor: transformers' functions in the official processor's order.

    kind: "qwen2" (Qwen2VLVideoProcessor, also Qwen2.5-VL), "qwen3", "onevision", "internvl" (frames
    from `InternVLVideoProcessor.sample_frames`, pixels as the OneVision ones), or "clip" (Video-LLaVA: frames
    from `BaseVideoProcessor.sample_frames`, i.e. `default_sample_indices_fn`, pixels from the image
    processor, which Video-LLaVA checkpoints configure like the video processor). settings: the
    resolved processor settings (the adapter's); sample=False reads every frame (do_sample_frames off).
    """

    def __init__(self, kind: str, settings: dict, image_processor=None, num_frames: int | None = None,
                 sample: bool = True):
        self.kind, self.s, self.image_processor = kind, settings, image_processor
        self.num_frames, self.sample = num_frames, sample
        self.merge_size = settings.get("merge_size")
        self.temporal_patch_size = settings.get("temporal_patch_size")

    def indices_fn(self):
        """The official sample_indices_fn (None: every frame)."""
        from transformers.video_utils import default_sample_indices_fn

        s = self.s
        if self.kind in ("clip", "onevision"):
            return functools.partial(default_sample_indices_fn, num_frames=self.num_frames) if self.sample else None
        if self.kind == "internvl":  # InternVLVideoProcessor.sample_frames (middle of k segments)
            fn = installed(INTERNVL_VIDEO, "InternVLVideoProcessor.sample_frames")
            return functools.partial(fn, SimpleNamespace(num_frames=None, initial_shift=s["initial_shift"]),
                                     num_frames=self.num_frames) if self.sample else None
        if not (self.sample and s["do_sample_frames"]):
            return None
        if self.kind == "qwen2":
            fn = installed(QWEN2_VIDEO, "Qwen2VLVideoProcessor.sample_frames")
            return functools.partial(fn, SimpleNamespace(**s), temporal_patch_size=s["temporal_patch_size"],
                                     min_frames=s["min_frames"], max_frames=s["max_frames"],
                                     num_frames=s["num_frames"], fps=s["fps"])
        fn = installed(QWEN3_VIDEO, "Qwen3VLVideoProcessor.sample_frames")
        return functools.partial(fn, SimpleNamespace(**s), num_frames=s["num_frames"], fps=s["fps"])

    def decode(self, path: str):
        from transformers.video_utils import load_video

        return load_video(path, backend="pyav", sample_indices_fn=self.indices_fn())

    def __call__(self, videos, **kwargs):
        from transformers.feature_extraction_utils import BatchFeature

        path = videos[0][0] if isinstance(videos[0], (list, tuple)) else videos[0]
        frames, meta = self.decode(path)
        self.last_indices = [int(i) for i in meta.frames_indices]
        if self.kind == "clip":
            images = [Image.fromarray(f) for f in frames]
            pixels = self.image_processor(images=images, return_tensors="pt", return_legacy_image_output=False)
            return BatchFeature({"pixel_values_videos": pixels["pixel_values"][None]})
        if self.kind in ("onevision", "internvl"):  # the same steps: resize to size, rescale, normalise
            return BatchFeature({"pixel_values_videos": self.onevision_pixels([Image.fromarray(f) for f in frames])})
        pixels, grid = self.qwen_pixels([Image.fromarray(f) for f in frames])
        return BatchFeature({"pixel_values_videos": pixels, "video_grid_thw": grid, "video_metadata": [meta]})

    def resize_target(self, num_frames: int, height: int, width: int) -> tuple[int, int]:
        s = self.s
        factor = s["patch_size"] * s["merge_size"]
        lo, hi = s["size"]["shortest_edge"], s["size"]["longest_edge"]
        if self.kind == "qwen2":
            from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize
            return smart_resize(height, width, factor=factor, min_pixels=lo, max_pixels=hi)
        smart_resize = installed(QWEN3_VIDEO, "smart_resize")
        return smart_resize(num_frames=num_frames, height=height, width=width, factor=factor,
                            temporal_factor=s["temporal_patch_size"], min_pixels=lo, max_pixels=hi)

    def onevision_pixels(self, frames: list[Image.Image]) -> torch.Tensor:
        """LlavaOnevisionVideoProcessor: each frame resized to `size` (PIL here), rescaled, normalised."""
        from transformers.image_transforms import normalize, rescale

        s = self.s
        h, w = s["size"]["height"], s["size"]["width"]
        arrays = []
        for f in frames:
            a = np.asarray(f.convert("RGB").resize((w, h), resample=int(s["resample"])), dtype=np.float32)
            a = normalize(rescale(a, s["rescale_factor"], input_data_format="channels_last"), s["image_mean"],
                          s["image_std"], input_data_format="channels_last")
            arrays.append(torch.from_numpy(np.ascontiguousarray(a.transpose(2, 0, 1))))
        return torch.stack(arrays)[None].float()  # (1, F, C, H, W)

    def qwen_pixels(self, frames: list[Image.Image]):
        from transformers.image_transforms import normalize, rescale

        s = self.s
        h, w = self.resize_target(len(frames), frames[0].height, frames[0].width)
        arrays = []
        for f in frames:  # PIL resize (the official one is torchvision's), then rescale + normalise
            a = np.asarray(f.resize((w, h), resample=int(s["resample"])), dtype=np.float32)
            a = rescale(a, s["rescale_factor"], input_data_format="channels_last")
            a = normalize(a, s["image_mean"], s["image_std"], input_data_format="channels_last")
            arrays.append(torch.from_numpy(np.ascontiguousarray(a.transpose(2, 0, 1))))
        video = torch.stack(arrays)[None].float()  # (1, F, C, H, W)
        patchify = installed(QWEN3_VIDEO if self.kind == "qwen3" else QWEN2_VIDEO,
                             ("Qwen3VLVideoProcessor" if self.kind == "qwen3" else "Qwen2VLVideoProcessor") + ".patchify")
        patches, gt, gh, gw = patchify(None, video, patch_size=s["patch_size"], merge_size=s["merge_size"],
                                       temporal_patch_size=s["temporal_patch_size"])
        return patches[0], torch.tensor([[gt, gh, gw]])


def messages(kind: str, items: list[dict], prompt: str) -> list[dict]:
    return [{"role": "user", "content": [dict(type=kind, **it) for it in items] + [{"type": "text", "text": prompt}]}]
