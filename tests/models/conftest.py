"""Fixtures the family tests share."""
from __future__ import annotations

import pytest

from mipruner.media import write_video

from .tiny_llava import scene


@pytest.fixture(scope="module")
def video_path(tmp_path_factory):
    """A 12-frame clip of a square moving right (80 x 60 px), one per test module."""
    frames = [scene(80, 60, square=(4 * i, 10, 4 * i + 14, 24), seed=i) for i in range(12)]
    return write_video(frames, str(tmp_path_factory.mktemp("vid") / "clip.mp4"))
