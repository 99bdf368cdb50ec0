"""The video input of `bench ops` and `bench latency` (`--video-frames 8,16,32 --video-family F`).

A video of F frames (`zoo.make_media("video", tiny, F)`: 448 x 336 seeded pictures, 112 x 84 with --tiny) is
laid out as the family's processor lays it out, without running the vision tower (`layout`):
  qwen2_5_vl       the video processor's resize (`adapter.video_resize_target`), a patch of `patch_size`, a
                   2 x 2 merge and a temporal patch of `temporal_patch_size` (2): T = ceil(F / 2) token-frames
                   of (H / patch) (W / patch) / merge^2 tokens each;
  llava_onevision  every frame the tower's g x g grid (g = image_size / patch_size) pooled to ceil(g / 2)^2,
                   then one newline for the video (a token of no frame), as the adapter's layout.
Every number is read from the family's config and processor (the random-weight builders of
`mipruner.models.*.random_weights`, real shapes or --tiny); tests/test_bench_video.py checks the layout
against the adapter's own encoding. `inputs` gives the pre-LLM methods random tensors of that layout: visual
(N_V, d) at the LLM's width d, text (N_T, d), `frame_index`, and where a method reads attention a (N_V + 1)^2
softmax matrix with [CLS] first (no per-head copy: a 32-frame OneVision video has 6,273 tokens).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

FAMILIES = ("qwen2_5_vl", "llava_onevision")
METHODS = ("evs", "vidcom2", "fastvid")  # the video methods; the per-frame option is a parameter of the others
RATE = 0.75  # EVS's q in the latency cells (vLLM's --video-pruning-rate)


@dataclass(frozen=True)
class Layout:
    """A video of `frames` frames as the family lays it out: `n_visual` tokens, `token_frames` frames of
    `per_frame` tokens (Qwen: one token-frame per 2 frames), `outside` tokens of no frame, `frame_index` (N_V,)."""

    family: str
    frames: int
    size: tuple[int, int]
    n_visual: int
    token_frames: int
    per_frame: int
    outside: int
    hidden: int
    frame_index: torch.Tensor

    def as_dict(self) -> dict:
        return {k: getattr(self, k) for k in ("family", "frames", "size", "n_visual", "token_frames", "per_frame",
                                              "outside", "hidden")}


def build(family: str, *, tiny: bool, device="cpu", dtype=torch.float32, llm_layers: int | None = None, seed=0,
          vision_layers: int | None = None):
    """(adapter, description): the family's random-weight model (`zoo`), real widths unless tiny; `vision_layers`
    N keeps the tower's first N blocks (a CPU proxy, as `llm_layers` for the LLM: the real tower of 32 or 26
    blocks takes minutes per video on a CPU; the tokens, widths and processor stay the family's)."""
    from .zoo import get_family

    if family not in FAMILIES:
        raise SystemExit(f"--video-family must be one of {', '.join(FAMILIES)}, got {family!r}")
    adapter, desc = get_family(family).build(tiny=tiny, device=device, dtype=dtype, seed=seed, llm_layers=llm_layers)
    if vision_layers:
        desc += f"; tower cut to its first {cut_tower(adapter, vision_layers)} blocks"
    return adapter, desc


def cut_tower(adapter, n: int) -> int:
    """Keep the first n blocks of the adapter's vision tower (its config's depth set to match); returns n."""
    m, v = adapter.model.model, adapter.config.vision_config
    if hasattr(m, "visual"):  # Qwen: the ViT's blocks (the adapter reads the depth from them)
        m.visual.blocks = m.visual.blocks[:n]
        v.depth = n
    else:  # SigLIP / CLIP: the encoder's layers
        from mipruner.models.common.clip_attention import encoder_layers

        enc = encoder_layers(m.vision_tower)
        holder = next(x for x in m.vision_tower.modules() if getattr(x, "layers", None) is enc)
        holder.layers = enc[:n]
        v.num_hidden_layers = n
    return n


def media(frames: int, tiny: bool, size: tuple[int, int] | None = None):
    """`zoo.make_media("video", tiny, frames)`, or its frames at `size` (W, H): the same seeded pictures."""
    from mipruner.media import Video

    from .zoo import make_media, picture

    if size is None:
        return make_media("video", tiny, frames)
    return Video(frames=[picture(*size, seed=10 + i) for i in range(frames)], indices=list(range(frames)), fps=4.0,
                 total_frames=frames)


def parse_size(text: str | None) -> tuple[int, int] | None:
    """'448x336' -> (448, 336); None stays None (the zoo's size)."""
    if not text:
        return None
    try:
        w, h = (int(x) for x in text.lower().split("x"))
    except ValueError:
        raise SystemExit(f"--video-size takes WxH, e.g. 448x336, got {text!r}") from None
    return w, h


def layout(adapter, family: str, frames: int, tiny: bool, size: tuple[int, int] | None = None) -> Layout:
    """The layout of `media(frames, tiny, size)` under `adapter`'s processor and config (module docstring)."""
    w, h = media(1, tiny, size).frames[0].size
    config = adapter.config
    hidden = int((getattr(config, "text_config", None) or config).hidden_size)
    if family == "qwen2_5_vl":
        v = config.vision_config
        patch, merge, temporal = int(v.patch_size), int(v.spatial_merge_size), int(v.temporal_patch_size)
        rh, rw = adapter.video_resize_target(frames, h, w)
        t, per = math.ceil(frames / temporal), (rh // patch) * (rw // patch) // merge ** 2
        index = torch.arange(t).repeat_interleave(per)
        return Layout(family, frames, (w, h), t * per, t, per, 0, hidden, index)
    if family == "llava_onevision":
        v = config.vision_config
        g = int(v.image_size) // int(v.patch_size)
        per = math.ceil(g / 2) ** 2
        index = torch.cat([torch.arange(frames).repeat_interleave(per), torch.full((1,), -1)])
        return Layout(family, frames, (w, h), frames * per + 1, frames, per, 1, hidden, index)
    raise SystemExit(f"--video-family must be one of {', '.join(FAMILIES)}, got {family!r}")


def retained(lay: Layout, q: float = RATE) -> int:
    """The tokens EVS keeps of this video at rate q (`pruners.evs.retained_count`): the budget every video
    method gets in the bench, so that they compare at equal tokens."""
    from mipruner.pruners.evs import retained_count

    return retained_count(lay.per_frame, lay.token_frames, q)


def inputs(lay: Layout, n_text: int, seed: int = 0, attention: bool = False, device="cpu",
           dtype=torch.float32) -> dict:
    """Random inputs of the layout (module docstring), on `device` in `dtype` (frame_index int64)."""
    g = torch.Generator().manual_seed(seed)
    n, d = lay.n_visual, lay.hidden
    kw = {"visual": torch.randn(n, d, generator=g), "text": torch.randn(n_text, d, generator=g)}
    if attention:
        kw["attention"] = torch.randn(n + 1, n + 1, generator=g).softmax(dim=-1)
        kw["keys"] = torch.randn(n + 1, 64, generator=g)
    kw = {k: v.to(device=device, dtype=dtype) for k, v in kw.items()}
    kw["frame_index"] = lay.frame_index.to(device)
    return kw


def parse_frames(text: str) -> list[int]:
    """'8,16,32' -> [8, 16, 32] (each at least 2)."""
    out = [int(x) for x in text.split(",") if x.strip()]
    if not out or min(out) < 2:
        raise SystemExit(f"--video-frames takes frame counts of at least 2, got {text!r}")
    return out


__all__ = ["FAMILIES", "METHODS", "RATE", "Layout", "build", "inputs", "layout", "media", "parse_frames", "parse_size",
           "retained"]
