"""Reading images and videos into RGB PIL frames as transformers' processors read them; plain errors.

Images (`load_image`), exactly as transformers 5 does it (checked against it in tests/test_media.py):
  * a file path: `transformers.image_utils.load_image`, which every image processor uses for a path
    (`fetch_images`): open, apply the EXIF orientation, `.convert("RGB")`. Transparency is dropped
    there, not composited;
  * an in-memory PIL image or array: `transformers.image_transforms.convert_to_rgb`, which every image
    processor applies (`do_convert_rgb`): RGBA, LA and a palette's transparent entry are composited
    onto white.
No torchvision anywhere.

Videos: `probe_video` is the one function that reads a video's metadata (frame count, fps, size)
without decoding; it refuses files with no video stream. `load_video` decodes with PyAV and keeps
the frames that a sampling rule picks from the stream's frame count and fps: each model adapter
passes its official video processor's rule, the default is `sample_indices` (transformers'
`video_utils.default_sample_indices_fn` with a frame count). Error messages name files by their
base name only.

Decoding is bounded while it runs (`DecodeLimits`): frames decoded (counted, not the header's count),
each frame's pixels (the header's, then each decoded frame's) and seconds spent; past a bound the video
is refused with a sentence. Every `load_video` applies them (model adapters, sweep items); an app sets
its own with `set_decode_limits` (app.py does, from its flags).
"""
from __future__ import annotations

import hashlib
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

VIDEO_EXTENSIONS = (".mp4", ".avi", ".mov", ".mkv", ".webm", ".m4v", ".gif", ".mpg", ".mpeg")
MAX_DECODE_FRAMES = 10_000  # a guard against pathological streams
MAX_IMAGE_PIXELS = 50_000_000  # larger pictures are refused from their header, before decoding
MAX_FRAME_PIXELS = 8192 * 4320  # a video frame larger than 8K UHD is refused (header, then each decoded frame)


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


@dataclass(frozen=True)
class VideoInfo:
    """A video file's first video stream, from the container's metadata (nothing decoded).

    frames: frame count (0 when the container does not say); exact: it is the stream's own count,
    not an estimate from the duration; fps: average frame rate (0.0 when unknown)."""

    frames: int
    fps: float
    width: int
    height: int
    exact: bool


@dataclass(frozen=True)
class DecodeLimits:
    """Bounds on decoding one video, checked while it decodes: frames in one pass, a frame's pixels, seconds
    in all (None: no bound). The library's default bounds the pixels only (long evaluation videos decode)."""

    frames: int | None = None  # None: any number (a stream that states no count is counted up to MAX_DECODE_FRAMES)
    pixels: int = MAX_FRAME_PIXELS
    seconds: float | None = None


_LIMITS = [DecodeLimits()]


def set_decode_limits(limits: DecodeLimits) -> DecodeLimits:
    """Make `limits` the bounds of every later `load_video` without its own; returns the previous ones."""
    if not ((limits.frames is None or limits.frames >= 1) and limits.pixels >= 1
            and (limits.seconds is None or limits.seconds > 0)):
        raise ValueError(f"decode limits must be positive, got {limits}")
    old, _LIMITS[0] = _LIMITS[0], limits
    return old


def decode_limits() -> DecodeLimits:
    return _LIMITS[0]  # what `load_video` applies when given none (`set_decode_limits`)


def is_video_path(path: str) -> bool:
    """Image or video by the name's extension: decided before the file is opened."""
    return str(path).lower().endswith(VIDEO_EXTENSIONS)


# ------------------------------------------------------------------------------------- images
def to_rgb(image: Image.Image) -> Image.Image:
    """`transformers.image_transforms.convert_to_rgb` on a PIL image: transparency onto white."""
    if "A" in image.getbands() or image.info.get("transparency") is not None:
        rgba = image.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")
    return image.convert("RGB")


def _array_to_rgb(arr: np.ndarray) -> Image.Image:
    """`convert_to_rgb` on a channels-last uint8 array: 1 channel repeated, 4 blended onto white."""
    if arr.ndim != 3 or arr.shape[2] not in (1, 3, 4):
        raise MediaError(f"an image array must be (H, W, 1|3|4), got shape {arr.shape}")
    arr = arr.astype(np.uint8)
    if arr.shape[2] == 1:
        arr = np.repeat(arr, 3, axis=-1)
    elif arr.shape[2] == 4:
        alpha = arr[..., 3:4] / 255
        arr = np.round(alpha * arr[..., :3] + (1 - alpha) * 255).astype(np.uint8)
    return Image.fromarray(arr)


def load_image(source) -> Image.Image:
    """An RGB PIL image from a path, a PIL image or an (H, W, 1|3|4) uint8 array (see module doc)."""
    if isinstance(source, Image.Image):
        return to_rgb(source)
    if isinstance(source, np.ndarray):
        return _array_to_rgb(source)
    path = os.fspath(source)
    name = os.path.basename(path)
    if not os.path.isfile(path):
        raise MediaError(f"image file not found: {name!r}")
    try:
        with Image.open(path) as im:
            if im.width * im.height > MAX_IMAGE_PIXELS:
                raise Image.DecompressionBombError(f"Image size ({im.width * im.height} pixels)")
            im.load()  # forces a full decode: truncated files fail here, not later
            return ImageOps.exif_transpose(im).convert("RGB")
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


# ------------------------------------------------------------------------------------- videos
def _reason(e: BaseException, path: str) -> str:
    """An exception's message without the file's directory in it."""
    text = getattr(e, "strerror", None) or str(e) or type(e).__name__
    return str(text).replace(path, os.path.basename(path))


def probe_video(path) -> VideoInfo:
    """Frame count, fps and size of the first video stream, read from the container's metadata.

    Raises MediaError for a missing file, a file PyAV cannot open, or one without a video stream.
    When the stream does not state its frame count, it is estimated from the stream's (else the
    container's) duration times the frame rate, and `exact` is False.
    """
    import av  # local: PyAV is only needed for video

    path = os.fspath(path)
    name = os.path.basename(path)
    if not os.path.isfile(path):
        raise MediaError(f"video file not found: {name!r}")
    try:
        with av.open(path) as c:
            if not c.streams.video:
                raise MediaError(f"{name!r} has no video stream")
            s = c.streams.video[0]
            fps = float(s.average_rate or s.guessed_rate or 0) or 0.0
            n = int(s.frames or 0)
            exact = n > 0
            if not n and s.duration and s.time_base and fps:
                n = int(float(s.duration * s.time_base) * fps)
            if not n and c.duration and fps:
                n = int(c.duration / 1e6 * fps)
            return VideoInfo(frames=n, fps=fps, width=int(s.codec_context.width or 0),
                             height=int(s.codec_context.height or 0), exact=exact)
    except MediaError:
        raise
    except (av.error.FFmpegError, OSError, ValueError, UnicodeDecodeError) as e:
        raise MediaError(video_problem(name, e, path, verb="read")) from None


def sample_indices(total: int, num: int) -> list[int]:
    """`num` evenly spaced frame indices of [0, total): i * total // num, transformers'
    `default_sample_indices_fn` with `num_frames`. Every frame when num >= total (where
    transformers refuses num > total)."""
    if total <= 0:
        return []
    if num >= total:
        return list(range(total))
    return [i * total // num for i in range(num)]


def av_errors() -> tuple[type[BaseException], ...]:
    """PyAV's error classes and the OS errors a read can raise."""
    import av
    return (av.error.FFmpegError, OSError)


def _decode(path: str, wanted: set[int], limits: DecodeLimits, started: float
            ) -> tuple[dict[int, Image.Image], int, str]:
    """One decoding pass: the wanted frames as RGB images, the number of frames decoded (it stops
    after the last wanted frame; with none wanted it counts them all, up to MAX_DECODE_FRAMES when
    `limits` bound no frame count), and the decoder's error when it
    failed ("" if none). A MediaError when the pass goes past `limits` (frames decoded, a frame's pixels,
    seconds since `started`)."""
    import av

    name = os.path.basename(path)
    out: dict[int, Image.Image] = {}
    n, err = 0, ""
    last = max(wanted) if wanted else None
    with av.open(path) as container:
        stream = container.streams.video[0]
        _check_pixels(name, int(stream.codec_context.width or 0), int(stream.codec_context.height or 0), limits)
        try:
            for frame in container.decode(stream):
                _check_pixels(name, frame.width, frame.height, limits)
                if n in wanted:
                    out[n] = frame.to_image().convert("RGB")
                n += 1
                if last is not None and n > last:
                    break
                if last is None and limits.frames is None and n >= MAX_DECODE_FRAMES:
                    break  # no bound set: a stream that states no count is counted this far, as before
                if limits.frames is not None and n > limits.frames:
                    raise MediaError(f"video {name!r} has more than {limits.frames:,} frames; this app decodes at "
                                     "most that many (trim it to a short clip)")
                if limits.seconds is not None and time.monotonic() - started > limits.seconds:
                    raise MediaError(f"decoding video {name!r} took over {limits.seconds:g} s, the most this app "
                                     "spends on one video; use a shorter or smaller clip")
        except av.error.FFmpegError as e:
            err = f"(codec {stream.codec_context.name!r}): {_reason(e, path)}"
    return out, n, err


def _check_pixels(name: str, width: int, height: int, limits: DecodeLimits) -> None:
    if width * height > limits.pixels:
        raise MediaError(f"video {name!r} has frames of {width}x{height} pixels; this app decodes frames of at most "
                         f"{limits.pixels / 1e6:,.1f} megapixels (scale it down)")


def load_video(path, num_frames: int = 8, sample: Callable[[int, float], list[int]] | None = None,
               limits: DecodeLimits | None = None) -> Video:
    """Decode a video with PyAV and keep the frames `sample(total_frames, fps)` picks (default:
    `sample_indices(total_frames, num_frames)`), in the order given.

    total_frames is the stream's own frame count when it states one, else the number of frames
    decoded; when a picked frame cannot be decoded (the stream holds fewer frames than it states),
    the frames are picked again from the decodable count. Raises MediaError for a missing or
    unreadable file, a file with no video stream, a video with no decodable frame, a video past
    `limits` (default: `decode_limits()`), and whatever `sample` raises.
    """
    path = os.fspath(path)
    name = os.path.basename(path)
    limits = limits or decode_limits()
    if sample is None:
        if num_frames < 1:
            raise MediaError(f"num_frames must be >= 1, got {num_frames}")

        def sample(total, fps):
            return sample_indices(total, num_frames)
    info = probe_video(path)
    started = time.monotonic()
    try:
        total, err = (info.frames, "") if info.exact else _decode(path, set(), limits, started)[1:]
        idx = [int(i) for i in sample(total, info.fps)] if total else []
        got, n, err = _decode(path, set(idx), limits, started) if idx else ({}, total, err)
        if any(i not in got for i in idx):  # fewer decodable frames than stated
            total = _decode(path, set(), limits, started)[1]
            idx = [int(i) for i in sample(total, info.fps)] if total else []
            got, n, err = _decode(path, set(idx), limits, started) if idx else ({}, total, err)
    except av_errors() as e:
        raise MediaError(f"cannot read video {name!r}: {_reason(e, path)}") from None
    if not total or not idx or any(i not in got for i in idx):
        raise MediaError(f"cannot decode video {name!r} {err}".strip() if err
                         else f"video {name!r} has no decodable frames")
    return Video(frames=[got[i] for i in idx], indices=idx, fps=info.fps, total_frames=total, path=path,
                 meta={"width": info.width, "height": info.height})


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
    """An RGB PIL image, a list of them, or a `Video`, from whatever the user gave."""
    if isinstance(source, Video):
        return source
    if isinstance(source, (list, tuple)):
        if not source:
            raise MediaError("an empty list of images")
        return [load_image(s) for s in source]
    if isinstance(source, (Image.Image, np.ndarray)):
        return load_image(source)
    if is_video_path(source):
        return load_video(source, num_frames)
    return load_image(source)


def media_hash(media: Any) -> str:
    """sha256 of the media's content: file bytes for a path, pixels for images, frames for videos.

    The one media key of the package: the app's encoding cache (`mipruner.serve.session`) and the lmms-eval
    answer cache (`mipruner.lmms.cache`) both key media by it, so the same media gets the same key in both."""
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
