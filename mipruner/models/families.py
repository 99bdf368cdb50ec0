"""The family table: the one list of the model families mipruner runs. Everything else is derived from it:
`mipruner.models.adapter_class` (config model_type -> adapter), the bench's zoo (`mipruner.bench.zoo`:
random weights at real shapes and the media each family takes), the app's suggested checkpoints
(`components.hosting.hub.SUGGESTED`), the README's and docs/models.md's family tables (tests/test_docs.py
compares them) and the family tests (tests/models/test_family_contract.py runs every check on every row).

A family is one folder `mipruner/models/<folder>/` (one folder may hold a line of close relatives, as
qwen/ holds Qwen2-VL, Qwen2.5-VL and Qwen3-VL) and one `Family` line below:
  name          the config's `model_type`;
  title         the checkpoint whose config the real-shape builder restates;
  builder       "module:function" under the family's folder: `fn(*, tiny, device, dtype, seed=0,
                llm_layers=None) -> (adapter, description)` (tiny=True: a few layers of small width);
                or the function itself;
  media         what its adapter reads, some of MEDIA:
                  image   one picture;
                  images  several pictures in one prompt, where the adapter takes a list of images as
                          images (LLaVA-1.5: one <image> each; LLaVA-OneVision, InternVL: one view or
                          tile set each). Qwen adapters read a list as a video's frames, Video-LLaVA as a
                          video, LLaVA-NeXT takes one image only;
                  video   `video_frames` frames. LLaVA-1.5 reads each frame as its own image (576 tokens
                          each at full size), so it gets 4: 8 frames would be 4,608 tokens, past its
                          4,096-position context, where the in-LLM methods refuse the prompt;
  adapter       "module:Class" under the folder;
  suggested     hub checkpoints the app offers in its model list;
  doc           the page that describes it (from the repository root).
Importing this module imports neither torch nor transformers.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable

MEDIA = ("image", "images", "video")


@dataclass(frozen=True)
class Family:
    name: str
    title: str
    builder: str | Callable
    media: tuple[str, ...]
    video_frames: int = 8
    folder: str = ""
    adapter: str = ""
    suggested: tuple[str, ...] = ()
    doc: str = "docs/models.md"

    def __post_init__(self):
        bad = [m for m in self.media if m not in MEDIA]
        if bad or not self.media:
            raise ValueError(f"{self.name}: media must be some of {MEDIA}, got {self.media}")

    def _find(self, ref: str):
        module, attr = ref.split(":")
        return getattr(importlib.import_module(f"mipruner.models.{self.folder}.{module}"), attr)

    @property
    def adapter_target(self) -> str:
        """The adapter as "package.module:Class" (a lazy entry of `mipruner.models.ADAPTERS`)."""
        module, attr = self.adapter.split(":")
        return f"mipruner.models.{self.folder}.{module}:{attr}"

    def adapter_class(self):
        """The adapter class (imports the family's folder, and transformers)."""
        return self._find(self.adapter)

    def builder_function(self) -> Callable:
        """The random-weight builder (imports the family's folder)."""
        return self._find(self.builder) if isinstance(self.builder, str) else self.builder

    def build(self, *, tiny: bool, device="cpu", dtype=None, seed: int = 0, llm_layers: int | None = None,
              image_size: int | None = None):
        """The random-weight model: (adapter, description); see the module doc. dtype None: float32 for
        tiny=True (what CPU tests compare in), bfloat16 at the real shape (as the checkpoints load).
        image_size: the vision tower's input side, for builders that take it (LLaVA-1.5, LLaVA-NeXT):
        tiny widths at a real geometry, e.g. 336 gives 576 visual tokens (24 x 24) as LLaVA-1.5-7B."""
        import inspect

        import torch

        if dtype is None:
            dtype = torch.float32 if tiny else torch.bfloat16
        fn = self.builder_function()
        kw = {}
        if image_size is not None:
            if "image_size" not in inspect.signature(fn).parameters:
                takes = [f.name for f in FAMILIES.values()
                         if "image_size" in inspect.signature(f.builder_function()).parameters]
                raise ValueError(f"{self.name}: its builder takes no image_size; those that do: {', '.join(takes)}")
            kw["image_size"] = int(image_size)
        return fn(tiny=tiny, device=device, dtype=dtype, seed=seed, llm_layers=llm_layers, **kw)


_IMAGE_VIDEO = ("image", "video")
_ALL = ("image", "images", "video")
FAMILIES: dict[str, Family] = {f.name: f for f in [
    Family("llava", "LLaVA-1.5-7B", "random_weights:build_llava", _ALL, 4, "llava", "llava_hf:LlavaAdapter",
           ("llava-hf/llava-1.5-7b-hf",)),
    Family("llava_next", "LLaVA-NeXT-7B", "random_weights:build_llava_next", ("image",), 8, "llava",
           "llava_next:LlavaNextAdapter", ("llava-hf/llava-v1.6-mistral-7b-hf",)),
    Family("video_llava", "Video-LLaVA-7B", "random_video_llava:build", _IMAGE_VIDEO, 8, "llava",
           "video_llava:VideoLlavaAdapter", ("LanguageBind/Video-LLaVA-7B-hf",)),
    Family("llava_onevision", "LLaVA-OneVision-7B", "random_weights:build", _ALL, 8, "onevision",
           "adapter:LlavaOnevisionAdapter",
           ("llava-hf/llava-onevision-qwen2-0.5b-ov-hf", "llava-hf/llava-onevision-qwen2-7b-ov-hf"),
           "docs/models-onevision.md"),
    Family("internvl", "InternVL3-8B", "random_weights:build", _ALL, 8, "internvl", "adapter:InternVLAdapter",
           ("OpenGVLab/InternVL3-1B-hf", "OpenGVLab/InternVL3-8B-hf"), "docs/models-internvl.md"),
    Family("qwen2_vl", "Qwen2-VL-2B", "random_weights:build_qwen2_vl", _IMAGE_VIDEO, 8, "qwen",
           "qwen2_vl:Qwen2VLAdapter", ("Qwen/Qwen2-VL-2B-Instruct",)),
    Family("qwen2_5_vl", "Qwen2.5-VL-3B", "random_weights:build_qwen2_5_vl", _IMAGE_VIDEO, 8, "qwen",
           "qwen2_vl:Qwen2VLAdapter", ("Qwen/Qwen2.5-VL-3B-Instruct",)),
    Family("qwen3_vl", "Qwen3-VL-2B", "random_weights:build_qwen3_vl", _IMAGE_VIDEO, 8, "qwen",
           "qwen3_vl:Qwen3VLAdapter", ("Qwen/Qwen3-VL-2B-Instruct",)),
]}


def get_family(name: str) -> Family:
    if name not in FAMILIES:
        raise ValueError(f"unknown family {name!r}; choose from {', '.join(FAMILIES)}")
    return FAMILIES[name]


def suggested_models() -> tuple[str, ...]:
    """Every family's suggested hub checkpoints, in the table's order."""
    return tuple(m for f in FAMILIES.values() for m in f.suggested)


__all__ = ["FAMILIES", "MEDIA", "Family", "get_family", "suggested_models"]
