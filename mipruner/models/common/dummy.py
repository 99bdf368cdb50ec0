"""A model-free adapter for tests and demos of the plumbing (lmms-eval's dummy backend).

Each visual token is a patch's centred mean colour (R-.5, G-.5, B-.5, .05) written into a d-dim
vector; prompt words get fixed hashed vectors, with "white"/"bright" pointing along (1, 1, 1, 0)
so they align with bright patches and oppose dark ones. It answers "yes" when a kept token is
bright (mean channel > 0.5) and "no" otherwise: pruning visibly changes answers.
"""
from __future__ import annotations

import hashlib

import numpy as np
import torch

from ...media import Video, load_media
from ..base import Adapter, Answer, Encoded, TokenGeometry, check_prompt, keep_indices
from .generation import GenerationConfig, processors
from .text import text_mask


def _word_vec(word: str, d: int) -> torch.Tensor:
    word = word.lower().strip(".,;:!?")
    seed = int(hashlib.sha256(word.encode()).hexdigest()[:8], 16)
    v = torch.randn(d, generator=torch.Generator().manual_seed(seed)) * 0.1
    if word in ("white", "bright"):
        v[:4] = torch.tensor([1.0, 1.0, 1.0, 0.0])
    return v


class DummyAdapter(Adapter):
    family = "dummy"

    def __init__(self, patch: int = 8, dim: int = 16):
        self.patch, self.dim = patch, dim

    @classmethod
    def from_pretrained(cls, path="dummy", device=None, dtype=None, **kwargs):
        return cls(**kwargs)

    def read_media(self, media):
        return load_media(media)

    def encode(self, media, prompt, *, text_mode="question", need_attention=False, signals=None) -> Encoded:
        """signals: accepted, but it has no vision encoder: it records no other block, head or feature."""
        check_prompt(prompt)
        media = load_media(media)
        frames = media.frames if isinstance(media, Video) else (media if isinstance(media, list) else [media])
        feats, fr, rows, cols, boxes, grids = [], [], [], [], [], []
        for f, im in enumerate(frames):
            a = np.asarray(im, dtype=np.float32) / 255.0
            gh, gw = a.shape[0] // self.patch, a.shape[1] // self.patch
            grids.append((gh, gw))
            for r in range(gh):
                for c in range(gw):
                    cell = a[r * self.patch:(r + 1) * self.patch, c * self.patch:(c + 1) * self.patch]
                    v = torch.zeros(self.dim)
                    v[:3] = torch.from_numpy(cell.reshape(-1, 3).mean(0)) - 0.5
                    v[3] = 0.05
                    feats.append(v)
                    fr.append(f), rows.append(r), cols.append(c)
                    boxes.append([c * self.patch, r * self.patch, (c + 1) * self.patch, (r + 1) * self.patch])
        templated = f"USER: {prompt} ASSISTANT:"
        tokens = templated.split()
        offsets, i = [], 0
        for t in tokens:
            j = templated.index(t, i)
            offsets.append((j, j + len(t)))
            i = j + len(t)
        text = torch.stack([_word_vec(t, self.dim) for t in tokens])
        geo = TokenGeometry(frame=torch.tensor(fr), row=torch.tensor(rows), col=torch.tensor(cols),
                            box=torch.tensor(boxes, dtype=torch.float32), kind=["patch"] * len(fr),
                            grids=grids, sizes=[im.size for im in frames])
        visual = torch.stack(feats)
        att = None
        if need_attention:  # brightness as a stand-in for [CLS] attention, CLS first
            n = visual.shape[0]
            att = torch.full((n + 1, n + 1), 1.0 / (n + 1))
            att[0, 1:] = torch.softmax(visual[:, :3].mean(1) * 8, dim=0)
        return Encoded(model="dummy", prompt=prompt, visual=visual, geometry=geo, text=text,
                       text_tokens=tokens, text_mask=text_mask(tokens, offsets, templated, prompt, text_mode),
                       text_mode=text_mode, frames=frames, is_video=isinstance(media, Video),
                       attention=att, has_cls=need_attention,
                       keys=torch.cat([visual.mean(0, keepdim=True), visual]) if need_attention else None)

    def prefill_logits(self, encoded, keep=None):
        idx = keep_indices(keep, encoded.n_visual)
        v = encoded.visual if idx is None else encoded.visual[idx]
        return torch.cat([v[:, :4], encoded.text[:, :4]])

    def generate(self, encoded, keep=None, max_new_tokens=None, *, config=None, logits_processor=None, **gen) -> Answer:
        GenerationConfig.of(8 if max_new_tokens is None and config is None else max_new_tokens, config, **gen)
        processors(logits_processor)  # checked as the real adapters check them; its answer reads no logits
        idx = keep_indices(keep, encoded.n_visual)
        v = encoded.visual if idx is None else encoded.visual[idx]
        bright = bool((v[:, :3].mean(1) > 0.0).any())
        return Answer(text="yes" if bright else "no", token_ids=[1 if bright else 0],
                      input_tokens=v.shape[0] + encoded.text.shape[0], visual_tokens=v.shape[0],
                      prefill_s=0.0, decode_s=0.0)
