"""Panel images as the files the page loads, made once per image: the slider's fast path.

A slider move changes a panel's kept mask; its heatmap and pivot map come back as the same image
objects (`CachedEncoding.drawn`). Gradio would still post-process every output of the event in a
worker thread of its own (one thread hop each, 40 outputs a move) and encode, hash and write every
image again. The page's view event is therefore wired with `postprocess=False` and hands Gradio
values already in their wire form (`prepared`): each output is post-processed here, in the
handler's thread, and an image that was already written (the same object, its file still there)
goes out as the same file, so the page re-fetches nothing for it.

Each file is written once, whole, and never again: Gradio's own `save_pil_to_cache` rewrites its file in place at
every post-process (`write_bytes` on a path named by the content's hash), so two draws of the same picture at
once (a video's first panels: the Run's draw and the frame selector's) truncate the file a browser is reading
(a short response, a broken panel image). `PanelImages.file` writes to a temporary name and renames it into
place, and leaves a file that is already there alone.

`PanelImages` keys on the image objects themselves (a weak reference each: an entry goes when its
image does), so two sessions never share an entry and memory follows the engine's caches.
"""
from __future__ import annotations

import hashlib
import io
import os
import tempfile
import threading
import weakref
from collections import OrderedDict
from pathlib import Path

from PIL import Image, PngImagePlugin

from mipruner import viz


class PanelImages:
    """Memos keyed by image object: its colour-bar composite, and its file in Gradio's cache."""

    def __init__(self, max_items: int = 256):
        self.max_items = max_items
        self._items: OrderedDict = OrderedDict()  # (kind, id(img), extra) -> (weakref to img, value)
        self._lock = threading.RLock()  # a weak reference's callback may run inside it (GC)

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)

    def _get(self, key, img):
        with self._lock:
            hit = self._items.get(key)
            if hit is not None and hit[0]() is img:
                self._items.move_to_end(key)
                return hit[1]
        return None

    def _put(self, key, img, value):
        with self._lock:
            self._items[key] = (weakref.ref(img, lambda _, k=key: self._forget(k)), value)
            self._items.move_to_end(key)
            while len(self._items) > self.max_items:
                self._items.popitem(last=False)
        return value

    def _forget(self, key) -> None:
        with self._lock:
            hit = self._items.get(key)
            if hit is not None and hit[0]() is None:
                del self._items[key]

    def with_colorbar(self, img: Image.Image, label: str) -> Image.Image:
        """`viz.with_colorbar(img, label)`, the same object for the same image and label."""
        key = ("bar", id(img), label)
        got = self._get(key, img)
        return got if got is not None else self._put(key, img, viz.with_colorbar(img, label))

    def cropped(self, img: Image.Image, box: tuple, scale: int = 1) -> Image.Image:
        """`img.crop(box)`, enlarged `scale` times (nearest: patches stay sharp), the same object for the same
        image, box and scale (so its file is written once)."""
        key = ("crop", id(img), tuple(box), scale)
        got = self._get(key, img)
        if got is not None:
            return got
        x0, y0, x1, y1 = box
        out = img.crop(box) if scale == 1 else img.resize(((x1 - x0) * scale, (y1 - y0) * scale), Image.NEAREST,
                                                           box=box)
        return self._put(key, img, out)  # PIL copies `info` (a heatmap's range) to both

    def file(self, img: Image.Image, block) -> dict:
        """What `block.postprocess(img)` sends the page (a file in Gradio's cache), written once."""
        key = ("file", id(img), getattr(block, "format", None))
        got = self._get(key, img)
        if got is not None and os.path.exists(got["path"]):  # a file pruned by the FileBudget is made again
            return dict(got)
        cache, fmt = getattr(block, "GRADIO_CACHE", None), getattr(block, "format", None)
        saved = written(img, cache, fmt) if cache and fmt else img  # a block of no cache: Gradio's own writing
        data = block.postprocess(saved).model_dump()  # a path: Gradio reads it as it is, writes nothing
        self._put(key, img, data)
        return dict(data)


def _encoded(img: Image.Image, fmt: str) -> tuple[bytes, str]:
    """The image's bytes in `fmt` (a PNG keeps the image's text entries, as Gradio's encoder does), or in PNG
    when PIL cannot write `fmt` (as Gradio falls back)."""
    for f in (fmt, "png"):
        try:
            with io.BytesIO() as out:
                if f.lower() == "png":
                    info = PngImagePlugin.PngInfo()
                    for k, v in img.info.items():
                        if isinstance(k, str) and isinstance(v, str):
                            info.add_text(k, v)
                    img.save(out, "png", pnginfo=info)
                else:
                    img.save(out, f)
                return out.getvalue(), f
        except (KeyError, ValueError):
            continue
    raise ValueError(f"cannot write an image as {fmt}")


def written(img: Image.Image, cache_dir: str, fmt: str) -> Path:
    """`img` as a file under `cache_dir` named by its bytes' hash, written whole under a temporary name and
    renamed into place (atomic), and not written at all when that file is there already: a browser reading the
    file never sees it shorter."""
    data, fmt = _encoded(img, fmt)
    folder = Path(cache_dir) / hashlib.sha256(data).hexdigest()
    path = folder / f"image.{fmt}"
    if path.is_file() and path.stat().st_size == len(data):
        return path.resolve()
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".image-", suffix=f".{fmt}")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    return path.resolve()


IMAGES = PanelImages()


def _wire(block, value, images: PanelImages):
    if value is None:
        return None
    if isinstance(value, Image.Image):
        return images.file(value, block)
    out = block.postprocess(value)
    return out.model_dump() if hasattr(out, "model_dump") else out


def prepared(blocks: list, values: list, images: PanelImages = IMAGES) -> list:
    """`values` for `blocks` as Gradio's postprocess would send them, for an event wired with
    `postprocess=False`; update dicts keep their props, State values pass as they are."""
    out = []
    for block, v in zip(blocks, values, strict=True):
        if isinstance(v, dict) and v.get("__type__") == "update":
            if "value" in v:
                v = {**v, "value": _wire(block, v["value"], images)}
        elif not getattr(block, "stateful", False):
            v = _wire(block, v, images)
        out.append(v)
    return out


__all__ = ["IMAGES", "PanelImages", "prepared", "written"]
