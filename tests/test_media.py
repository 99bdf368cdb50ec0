"""Image/video reading: even frame sampling, and plain errors for bad files."""
import numpy as np
import pytest
from PIL import Image

from mipruner.media import MediaError, load_image, load_media, load_video, sample_indices, write_video


def frames(n, w=48, h=32):
    # Frame i is a flat grey of value 10 * i, so a decoded frame tells which one it was.
    return [Image.fromarray(np.full((h, w, 3), 10 * i, dtype=np.uint8)) for i in range(n)]


def test_sample_indices_even_and_in_range():
    assert sample_indices(16, 8) == [1, 3, 5, 7, 9, 11, 13, 15]
    assert sample_indices(5, 8) == [0, 1, 2, 3, 4]
    assert sample_indices(0, 8) == []
    idx = sample_indices(1000, 8)
    assert len(idx) == 8 and idx == sorted(idx) and 0 <= idx[0] and idx[-1] < 1000


def test_video_round_trip(tmp_path):
    path = write_video(frames(20), tmp_path / "clip.mp4", fps=5)
    video = load_video(path, num_frames=4)
    assert video.total_frames == 20 and video.indices == sample_indices(20, 4)
    assert len(video.frames) == 4 and video.size == (48, 32) and video.fps == pytest.approx(5.0)
    means = [float(np.asarray(f).mean()) for f in video.frames]
    assert [round(m / 10) for m in means] == video.indices  # the right frames came back
    assert isinstance(load_media(str(path), num_frames=3).frames, list)


@pytest.mark.parametrize("content,match", [(b"", "cannot open"), (b"\x00garbage" * 50, "cannot open")])
def test_bad_video(tmp_path, content, match):
    p = tmp_path / "bad.mp4"
    p.write_bytes(content)
    with pytest.raises(MediaError, match=match):
        load_video(p)


def test_missing_files(tmp_path):
    with pytest.raises(MediaError, match="not found"):
        load_video(tmp_path / "none.mp4")
    with pytest.raises(MediaError, match="not found"):
        load_image(tmp_path / "none.png")


def test_truncated_and_non_images(tmp_path):
    good = tmp_path / "ok.png"
    Image.fromarray((np.random.default_rng(0).random((40, 40, 3)) * 255).astype(np.uint8)).save(good)
    assert load_image(good).size == (40, 40)
    cut = tmp_path / "cut.png"
    cut.write_bytes(good.read_bytes()[:200])
    with pytest.raises(MediaError, match="cannot read image"):
        load_image(cut)
    txt = tmp_path / "notes.jpg"
    txt.write_text("not an image")
    with pytest.raises(MediaError, match="cannot read image"):
        load_image(txt)


def test_arrays_and_modes():
    rgba = np.zeros((10, 12, 4), dtype=np.uint8)
    assert load_image(rgba).mode == "RGB" and load_image(rgba).size == (12, 10)
    with pytest.raises(MediaError, match="H, W"):
        load_image(np.zeros((10, 12)))
    assert load_image(Image.new("L", (5, 5))).mode == "RGB"
