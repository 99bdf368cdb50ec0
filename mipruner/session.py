"""Per-browser-session state: an LRU of encodings, keyed by what they are of (media content hash,
prompt, text mode, model). Sessions share no mutable state; the engine holds none per user.
"""
from __future__ import annotations

import hashlib
import os
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
from PIL import Image

from . import viz


class EncodingKey(NamedTuple):
    """What one cached encoding is of. `media` is a sha256 of the media's content."""

    model: str
    media: str
    prompt: str
    text_mode: str
    need_attention: bool


class StaleKeyError(LookupError):
    """The key names no encoding of this session (never encoded, evicted or expired)."""


def media_hash(media: Any) -> str:
    """sha256 of the media's content: file bytes for a path, pixels for images, frames for videos."""
    h = hashlib.sha256()

    def feed(x: Any) -> None:
        if isinstance(x, Image.Image):
            h.update(f"img:{x.mode}:{x.size}".encode())
            h.update(x.tobytes())
        elif isinstance(x, np.ndarray):
            h.update(f"arr:{x.dtype}:{x.shape}".encode())
            h.update(np.ascontiguousarray(x).tobytes())
        elif isinstance(x, (list, tuple)):
            h.update(f"list:{len(x)}".encode())
            for item in x:
                feed(item)
        elif isinstance(x, (str, os.PathLike)):
            path = os.fspath(x)
            h.update(f"file:{os.path.splitext(path)[1].lower()}".encode())  # the suffix picks image vs video
            with open(path, "rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    h.update(chunk)
        elif hasattr(x, "frames") and hasattr(x, "indices"):  # mipruner.media.Video
            h.update(f"video:{x.indices}:{x.fps}".encode())
            feed(list(x.frames))
        else:
            raise ValueError(f"unsupported media type {type(x).__name__}: give a path, a PIL image, an "
                             "array, a list of images or a Video")

    feed(media)
    return h.hexdigest()


@dataclass
class CachedEncoding:
    """One encoding and what was derived from it in this session."""

    encoded: Any  # mipruner.models.Encoded
    mi_cache: dict = field(default_factory=dict)  # the `cache=` of mipruner.select for this encoding
    layout: viz.Layout | None = None
    answers: dict = field(default_factory=dict)  # answer key -> Answer
    created: float = 0.0
    last_used: float = 0.0


@dataclass
class Session:
    """Per-browser-session state: an LRU of encodings. Never shared between sessions.

    max_entries: encodings kept (each holds N_V x d floats and their PMI caches);
    max_age_s: an encoding unused for this long is dropped.
    """

    max_entries: int = 3  # a handful of images per user; each is ~10 MB at 576 x 4096 fp32
    max_age_s: float = 1800.0  # 30 min idle: a user who walked away frees their memory
    entries: OrderedDict = field(default_factory=OrderedDict, repr=False)
    lock: threading.RLock = field(default_factory=threading.RLock, repr=False, compare=False)

    def __post_init__(self):
        if not (isinstance(self.max_entries, int) and self.max_entries >= 1):
            raise ValueError(f"max_entries must be an int >= 1, got {self.max_entries!r}")
        if not self.max_age_s > 0:
            raise ValueError(f"max_age_s must be > 0, got {self.max_age_s!r}")

    def keys(self) -> list[EncodingKey]:
        return list(self.entries)

    def expire(self, now: float) -> None:
        for k in [k for k, e in self.entries.items() if now - e.last_used > self.max_age_s]:
            del self.entries[k]
        while len(self.entries) > self.max_entries:
            self.entries.popitem(last=False)  # least recently used first


__all__ = ["CachedEncoding", "EncodingKey", "Session", "StaleKeyError", "media_hash"]
