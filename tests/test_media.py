"""Image/video reading: the same pixels and frames as transformers' own loaders, plain errors.

References are transformers' functions that import without torchvision:
`image_utils.load_image` (what every image processor does with a path), `image_transforms.convert_to_rgb`
(what it does with an in-memory image), `video_utils.default_sample_indices_fn` and
`video_utils.load_video(backend="pyav")`.
"""
import numpy as np
import pytest
from PIL import Image

from mipruner.media import MediaError, load_image, load_media, load_video, probe_video, sample_indices, write_video


def frames(n, w=48, h=32):
    # Frame i is a flat grey of value 10 * i, so a decoded frame tells which one it was.
    return [Image.fromarray(np.full((h, w, 3), 10 * i, dtype=np.uint8)) for i in range(n)]


def test_sample_indices_are_transformers_default_rule():
    from transformers.video_utils import VideoMetadata, default_sample_indices_fn

    for total in (1, 5, 7, 15, 16, 100, 1001):
        for num in range(1, min(total, 12) + 1):
            ref = default_sample_indices_fn(VideoMetadata(total_num_frames=total), num_frames=num)
            assert sample_indices(total, num) == ref.tolist(), (total, num)
    assert sample_indices(16, 8) == [0, 2, 4, 6, 8, 10, 12, 14]
    # more frames asked than the clip has: every frame (transformers refuses)
    assert sample_indices(5, 8) == [0, 1, 2, 3, 4]
    with pytest.raises(ValueError):
        default_sample_indices_fn(VideoMetadata(total_num_frames=5), num_frames=8)
    assert sample_indices(0, 8) == []


def test_video_frames_equal_transformers_pyav_loader(tmp_path):
    from transformers.video_utils import load_video as hf_load_video

    rng = np.random.default_rng(0)
    clip = [Image.fromarray(rng.integers(0, 255, (32, 48, 3), dtype=np.uint8)) for _ in range(15)]
    path = write_video(clip, tmp_path / "clip.mp4", fps=6)
    video = load_video(path, num_frames=4)
    ref, meta = hf_load_video(str(path), num_frames=4, backend="pyav")
    assert video.indices == list(meta.frames_indices) == [0, 3, 7, 11]
    assert video.total_frames == meta.total_num_frames == 15 and video.fps == pytest.approx(meta.fps)
    for ours, theirs in zip(video.frames, ref):
        assert np.array_equal(np.asarray(ours), theirs)


def test_video_round_trip_and_custom_sampler(tmp_path):
    path = write_video(frames(20), tmp_path / "clip.mp4", fps=5)
    video = load_video(path, num_frames=4)
    assert video.total_frames == 20 and video.indices == sample_indices(20, 4) == [0, 5, 10, 15]
    assert len(video.frames) == 4 and video.size == (48, 32) and video.fps == pytest.approx(5.0)
    means = [float(np.asarray(f).mean()) for f in video.frames]
    assert [round(m / 10) for m in means] == video.indices  # the right frames came back
    seen = []

    def rule(total, fps):
        seen.append((total, fps))
        return [total - 1, 0]

    v2 = load_video(path, sample=rule)
    assert seen == [(20, pytest.approx(5.0))] and v2.indices == [19, 0]
    assert [round(float(np.asarray(f).mean()) / 10) for f in v2.frames] == [19, 0]
    assert isinstance(load_media(str(path), num_frames=3).frames, list)


def test_probe_video(tmp_path):
    path = write_video(frames(7, w=64, h=48), tmp_path / "seven.mp4", fps=3)
    info = probe_video(path)
    assert (info.frames, info.width, info.height, info.exact) == (7, 64, 48, True)
    assert info.fps == pytest.approx(3.0)


def test_stream_without_a_frame_count_is_counted_by_decoding(tmp_path):
    """WebM states no frame count: probe estimates it from the duration, load_video counts frames."""
    import av

    path = str(tmp_path / "clip.webm")
    try:
        with av.open(path, "w") as out:
            stream = out.add_stream("libvpx-vp9", rate=5)
            stream.width, stream.height, stream.pix_fmt = 32, 32, "yuv420p"
            for im in frames(7, 32, 32):
                for packet in stream.encode(av.VideoFrame.from_image(im)):
                    out.mux(packet)
            for packet in stream.encode():
                out.mux(packet)
    except (av.error.FFmpegError, ValueError) as e:  # no VP9 encoder in this PyAV build
        pytest.skip(f"cannot write WebM here: {e}")
    info = probe_video(path)
    assert not info.exact and info.fps == pytest.approx(5.0)
    video = load_video(path, num_frames=3)
    assert video.total_frames == 7 and video.indices == [0, 2, 4]
    assert [round(float(np.asarray(f).mean()) / 10) for f in video.frames] == [0, 2, 4]


def _audio_only(path):
    import av

    with av.open(str(path), "w") as out:
        stream = out.add_stream("aac", rate=16000)
        frame = av.AudioFrame.from_ndarray(np.zeros((1, 1024), np.float32), format="fltp", layout="mono")
        frame.sample_rate = 16000
        for packet in [*stream.encode(frame), *stream.encode()]:
            out.mux(packet)
    return path


@pytest.mark.parametrize("content,match", [(b"", "cannot read video"), (b"\x00garbage" * 50, "cannot read video"),
                                           (None, "no video stream")])
def test_bad_video_messages_name_the_file_only(tmp_path, content, match):
    p = tmp_path / "bad.mp4"
    if content is None:
        _audio_only(p)
    else:
        p.write_bytes(content)
    for fn in (probe_video, load_video):
        with pytest.raises(MediaError, match=match) as e:
            fn(p)
        assert "'bad.mp4'" in str(e.value) and str(tmp_path) not in str(e.value)


def test_missing_files(tmp_path):
    for fn, name in ((load_video, "none.mp4"), (probe_video, "none.mp4"), (load_image, "none.png")):
        with pytest.raises(MediaError, match="not found") as e:
            fn(tmp_path / name)
        assert str(tmp_path) not in str(e.value)


def test_truncated_and_non_images(tmp_path):
    good = tmp_path / "ok.png"
    Image.fromarray((np.random.default_rng(0).random((40, 40, 3)) * 255).astype(np.uint8)).save(good)
    assert load_image(good).size == (40, 40)
    cut = tmp_path / "cut.png"
    cut.write_bytes(good.read_bytes()[:200])
    txt = tmp_path / "notes.jpg"
    txt.write_text("not an image")
    for bad in (cut, txt):
        with pytest.raises(MediaError, match="cannot read image") as e:
            load_image(bad)
        assert str(tmp_path) not in str(e.value)


# ------------------------------------------------------------------------------- image modes
def _modes():
    """PIL images of every mode the table test uses, with transparency where the mode has it."""
    rng = np.random.default_rng(1)
    rgb = rng.integers(0, 256, (24, 36, 3), dtype=np.uint8)
    alpha = np.tile(np.linspace(0, 255, 36).astype(np.uint8), (24, 1))
    out = {"rgba": Image.fromarray(np.dstack([rgb, alpha]), "RGBA"),
           "la": Image.fromarray(np.dstack([rgb[..., 0], alpha]), "LA"),
           "l": Image.fromarray(rgb[..., 1], "L"),
           "cmyk": Image.fromarray(rgb, "RGB").convert("CMYK"),
           "i16": Image.fromarray(rgb[..., 2].astype(np.uint16) * 257)}
    pal = Image.fromarray(rgb, "RGB").quantize(16)
    pal.info["transparency"] = 3
    out["palette"] = pal
    return out


@pytest.mark.parametrize("mode", ["rgba", "la", "l", "cmyk", "i16", "palette"])
def test_images_read_as_transformers_reads_them(tmp_path, mode):
    from transformers.image_transforms import convert_to_rgb
    from transformers.image_utils import load_image as hf_load_image

    im = _modes()[mode]
    ours = load_image(im)
    assert ours.mode == "RGB" and np.array_equal(np.asarray(ours), convert_to_rgb(im, return_numpy=True))
    path = str(tmp_path / ("x.jpg" if mode == "cmyk" else "x.png"))
    im.save(path)
    assert np.array_equal(np.asarray(load_image(path)), np.asarray(hf_load_image(path)))
    if mode in ("rgba", "la", "palette"):  # transparency: a path drops it, an image composites it
        assert not np.array_equal(np.asarray(load_image(path)), np.asarray(ours))


def test_exif_orientation_of_a_path_is_applied(tmp_path):
    from transformers.image_utils import load_image as hf_load_image

    im = Image.fromarray(np.random.default_rng(2).integers(0, 256, (20, 30, 3), dtype=np.uint8))
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90
    path = str(tmp_path / "rot.jpg")
    im.save(path, exif=exif.tobytes())
    ours = load_image(path)
    assert ours.size == (20, 30) and np.array_equal(np.asarray(ours), np.asarray(hf_load_image(path)))


def test_arrays_and_modes():
    from transformers.image_transforms import convert_to_rgb

    rng = np.random.default_rng(3)
    for c in (1, 3, 4):
        arr = rng.integers(0, 256, (10, 12, c), dtype=np.uint8)
        ours = load_image(arr)
        assert ours.mode == "RGB" and ours.size == (12, 10)
        assert np.array_equal(np.asarray(ours), convert_to_rgb(arr, return_numpy=True, input_data_format="channels_last"))
    with pytest.raises(MediaError, match="H, W"):
        load_image(np.zeros((10, 12)))
    assert load_image(Image.new("L", (5, 5))).mode == "RGB"
    assert load_media(Image.new("RGBA", (5, 5), (255, 0, 0, 0))).getpixel((0, 0)) == (255, 255, 255)
