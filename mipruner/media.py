"""Reading images and videos into PIL frames, with plain errors. No torchvision anywhere.

Videos are decoded with PyAV and sampled evenly (`sample_indices`): the frame count is the
model's choice (8 for Video-LLaVA, the processor's default for Qwen), made by the adapter.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

import numpy as np
from PIL import Image, UnidentifiedImageError

VIDEO_EXTENSIONS = (".mp4", ".avi", ".mov", ".mkv", ".webm", ".m4v", ".gif", ".mpg", ".mpeg")
MAX_DECODE_FRAMES = 10_000  # a guard against pathological streams
MAX_IMAGE_PIXELS = 50_000_000  # larger pictures are refused from their header, before decoding


class MediaError(ValueError):
    """A file that cannot be used as an image or a video; the message says why."""


@dataclass
class Video:
    """Sampled frames of one video: RGB PIL frames, their indices in the stream, and its fps."""

    frames: list[Image.Image]
    indices: list[int]
    fps: float
    total_frames: int
    path: str = ""
    meta: dict = field(default_factory=dict)

    @property
    def size(self) -> tuple[int, int]:
        return self.frames[0].size


def is_video_path(path: str) -> bool:
    return str(path).lower().endswith(VIDEO_EXTENSIONS)


def load_image(source) -> Image.Image:
    """An RGB PIL image from a path, a PIL image or an (H, W, 3) uint8 array."""
    if isinstance(source, Image.Image):
        return source.convert("RGB")
    if isinstance(source, np.ndarray):
        if source.ndim != 3 or source.shape[2] not in (3, 4):
            raise MediaError(f"an image array must be (H, W, 3|4), got shape {source.shape}")
        return Image.fromarray(source.astype(np.uint8)).convert("RGB")
    path = os.fspath(source)
    if not os.path.isfile(path):
        raise MediaError(f"image file not found: {path}")
    try:
        with Image.open(path) as im:
            if im.width * im.height > MAX_IMAGE_PIXELS:
                raise Image.DecompressionBombError(f"Image size ({im.width * im.height} pixels)")
            im.load()  # forces a full decode: truncated files fail here, not later
            return im.convert("RGB")
    except (UnidentifiedImageError, Image.DecompressionBombError, OSError, SyntaxError, ValueError) as e:
        raise MediaError(image_problem(os.path.basename(path), e)) from None


def image_problem(name: str, err: BaseException) -> str:
    """A plain reason why the image file `name` could not be read (no paths, no library jargon)."""
    if isinstance(err, Image.DecompressionBombError):
        m = re.search(r"\((\d+) pixels\)", str(err))
        size = f" ({int(m.group(1)) / 1e6:,.0f} megapixels)" if m else ""
        why = f"it is too large to open safely{size}; use one of at most {MAX_IMAGE_PIXELS / 1e6:.0f} megapixels"
    elif isinstance(err, UnidentifiedImageError):
        why = "it is not a picture this app knows; use PNG, JPEG, WebP, GIF or BMP"
    elif "truncated" in str(err).lower():
        why = "the file is incomplete or damaged (it ends too early); upload it again"
    else:
        why = "the file is damaged or in an unsupported format"
    return f"cannot read image {name!r}: {why}"


def video_problem(name: str, err: BaseException, path: str = "", verb: str = "open") -> str:
    """A plain reason why the video file `name` could not be opened (no paths, no error numbers)."""
    if path and os.path.isfile(path) and os.path.getsize(path) == 0:
        return f"cannot {verb} video {name!r}: the file is empty (0 bytes); upload it again"
    why = str(getattr(err, "strerror", None) or "")
    why = f" ({why[:1].lower()}{why[1:]})" if why and os.sep not in why else ""
    return f"cannot {verb} video {name!r}: not a video this app can decode{why}; use MP4, WebM, MOV, MKV or AVI"


def sample_indices(total: int, num: int) -> list[int]:
    """`num` evenly spaced frame indices over [0, total): centres of `num` equal segments."""
    if total <= 0:
        return []
    if num >= total:
        return list(range(total))
    edges = np.linspace(0, total, num + 1)
    return [min(total - 1, int((edges[i] + edges[i + 1]) / 2)) for i in range(num)]


def load_video(path, num_frames: int = 8) -> Video:
    """Decode a video with PyAV and keep `num_frames` evenly sampled RGB frames.

    Raises MediaError for a missing file, a container PyAV cannot open, a stream with an
    unsupported codec, or a video with no decodable frame.
    """
    import av  # local: PyAV is only needed for video

    path = os.fspath(path)
    if num_frames < 1:
        raise MediaError(f"num_frames must be >= 1, got {num_frames}")
    if not os.path.isfile(path):
        raise MediaError(f"video file not found: {path}")
    name = os.path.basename(path)
    try:
        container = av.open(path)
    except (av.error.FFmpegError, OSError, ValueError) as e:
        raise MediaError(video_problem(name, e, path)) from None
    with container:
        if not container.streams.video:
            raise MediaError(f"{name!r} has no video stream")
        stream = container.streams.video[0]
        fps = float(stream.average_rate or stream.guessed_rate or 0) or 0.0
        decoded = []
        try:
            for frame in container.decode(stream):
                decoded.append(frame)
                if len(decoded) >= MAX_DECODE_FRAMES:
                    break
        except av.error.FFmpegError as e:
            if not decoded:
                raise MediaError(f"cannot decode video {name!r} (codec {stream.codec_context.name!r}): the file "
                                 "is damaged or the codec is not supported") from None
        if not decoded:
            raise MediaError(f"video {name!r} has no decodable frames")
        idx = sample_indices(len(decoded), num_frames)
        frames = [decoded[i].to_image().convert("RGB") for i in idx]
    return Video(frames=frames, indices=idx, fps=fps, total_frames=len(decoded), path=path)


def write_video(frames: list[Image.Image], path: str, fps: int = 4, codec: str = "mpeg4") -> str:
    """Encode RGB frames to a video file with PyAV (used for shipped examples and tests)."""
    import av

    w, h = frames[0].size
    with av.open(os.fspath(path), mode="w") as out:
        stream = out.add_stream(codec, rate=fps)
        stream.width, stream.height = w - w % 2, h - h % 2
        stream.pix_fmt = "yuv420p"
        for im in frames:
            frame = av.VideoFrame.from_image(im.convert("RGB").crop((0, 0, stream.width, stream.height)))
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return os.fspath(path)


def load_media(source, num_frames: int = 8):
    """A PIL image, a list of PIL images, or a `Video`, from whatever the user gave."""
    if isinstance(source, (Video, Image.Image)):
        return source
    if isinstance(source, (list, tuple)):
        if not source:
            raise MediaError("an empty list of images")
        return [load_image(s) for s in source]
    if isinstance(source, np.ndarray):
        return load_image(source)
    if is_video_path(source):
        return load_video(source, num_frames)
    return load_image(source)
