"""`mipruner.media`'s decode bounds on their own: frames are counted as they decode (a stream that states no
count, or a wrong one), a frame's pixels are checked from the header and as decoded, and the seconds spent;
each refusal is a sentence naming the file. The library's default leaves long videos alone."""
from __future__ import annotations

import pytest

from mipruner.media import DecodeLimits, MediaError, decode_limits, load_video, probe_video, set_decode_limits

from .test_hosted_limits import video_of


@pytest.fixture(scope="module")
def endless(tmp_path_factory):
    path = tmp_path_factory.mktemp("decode") / "endless.mp4"
    video_of(path, 4000, (32, 32), True)  # an MPEG-4 stream under an .mp4 name: its header states no count
    return path


def test_frames_are_counted_as_they_decode(endless):
    assert probe_video(endless).frames == 0  # the header's count passes any check made on it
    with pytest.raises(MediaError, match=r"^video 'endless.mp4' has more than 3,600 frames; this app decodes at most"):
        load_video(endless, limits=DecodeLimits(frames=3600))
    video = load_video(endless, limits=DecodeLimits(frames=5000))
    assert video.total_frames == 4000 and len(video.frames) == 8  # what was decoded, not what the header said


def test_the_library_default_leaves_long_videos_alone(endless):
    assert decode_limits().frames is None
    assert load_video(endless).total_frames == 4000


def test_pixels_and_seconds_are_bounded(tmp_path, endless):
    huge = tmp_path / "huge.mp4"
    video_of(huge, 2, (4112, 2160), False)
    with pytest.raises(MediaError, match=r"^video 'huge.mp4' has frames of 4112x2160 pixels; this app decodes frames "
                                         r"of at most 8.8 megapixels"):
        load_video(huge, limits=DecodeLimits(pixels=4096 * 2160))
    assert load_video(huge, num_frames=1, limits=DecodeLimits(pixels=4112 * 2160)).size == (4112, 2160)
    with pytest.raises(MediaError, match=r"^decoding video 'endless.mp4' took over 1e-09 s, the most this app spends"):
        load_video(endless, limits=DecodeLimits(seconds=1e-9))  # past the bound after its first frame


def test_an_app_sets_the_bounds_of_every_load(endless):
    old = set_decode_limits(DecodeLimits(frames=100))
    try:
        with pytest.raises(MediaError, match="more than 100 frames"):
            load_video(endless)  # no limits given: the app's apply (model adapters and sweeps call it so)
    finally:
        set_decode_limits(old)
    with pytest.raises(ValueError, match="decode limits must be positive"):
        set_decode_limits(DecodeLimits(frames=0))
