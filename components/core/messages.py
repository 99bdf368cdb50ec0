"""Plain messages for the page: no server paths, no error numbers, no library jargon; and the
warnings the status line carries (prompt pieces the model cannot read, control characters removed).
No Gradio here (see `components.page.guards` for the hooks that use these on the server).
"""
from __future__ import annotations

import math
import os
import re
import unicodedata

from mipruner.serve.service import PromptWords
from mipruner.media import image_problem, video_problem

_PATH = re.compile(r"(?<![\w:/.~-])(?:/[^/\s'\"]+){2,}/?")  # an absolute path of 2+ parts (not a URL)
_ERRNO = re.compile(r"\[Errno -?\d+\]\s*")


_QUOTED = re.compile("'[^'\\n]{100,}'|\"[^\"\\n]{100,}\"")  # a quoted run of 100+ characters: part of an input
MAX_MESSAGE = 600


def short(value, n: int = 60) -> str:
    """`value` quoted, its first `n` characters only: what a message may show of an input."""
    text = str(value)
    return repr(text) if len(text) <= n else repr(text[:n]) + f"... ({len(text):,} characters)"


def plain(text) -> str:
    """A message fit for the page: file names instead of the server's paths, no error numbers, and no
    more than 60 characters of any quoted input (nor more than MAX_MESSAGE in all)."""
    text = _ERRNO.sub("", str(text))
    text = _PATH.sub(lambda m: os.path.basename(m.group(0).rstrip("/")), text)
    text = _QUOTED.sub(lambda m: m.group(0)[:61] + m.group(0)[0] + "...", text)
    if len(text) > MAX_MESSAGE:
        text = text[:MAX_MESSAGE - 3].rstrip() + "..."
    return text.strip() or "something went wrong"


def clean_prompt(prompt: str) -> tuple[str, int]:
    """The prompt without control characters (tabs and newlines stay), and how many were removed."""
    text = prompt.replace("\r\n", "\n")
    kept = "".join(c for c in text if c in "\t\n" or unicodedata.category(c) != "Cc")
    return kept, len(text) - len(kept)


def unknown_words_warning(model: str, words: PromptWords) -> str:
    """A Markdown warning naming the prompt's pieces the model cannot read ("" when there are none)."""
    if not words.unknown:
        return ""
    n = len(words.unknown)
    shown = ", ".join(f"`{w[:30].replace('`', chr(39))}`" for w in words.unknown[:10])
    more = f" and {n - 10} more" if n > 10 else ""
    msg = (f"**Warning:** {n} piece{'s' * (n != 1)} of the prompt {'are' if n != 1 else 'is'} unknown to "
           f"{model} and read as `{words.unk_token}`: {shown}{more}. The model cannot use "
           f"{'them' if n != 1 else 'it'}: scores and answers ignore what {'they say' if n != 1 else 'it says'}.")
    if words.known is not None:
        msg += f" Words {model} knows: {', '.join(words.known)}."
    return msg


def crop_note(enc) -> str:
    """A sentence when the model reads only part of the picture (a processor's centre crop): the part it
    reads, from the visual tokens' boxes; "" when the tokens cover (almost) all of it."""
    import torch

    geo = enc.geometry
    if enc.is_video or not len(geo.sizes):
        return ""
    w, h = geo.sizes[0]
    box = geo.box[geo.frame == 0]
    box = box[torch.isfinite(box).all(dim=1)]
    if not len(box):
        return ""
    x0, y0 = box[:, 0].min().clamp(min=0), box[:, 1].min().clamp(min=0)
    x1, y1 = box[:, 2].max().clamp(max=w), box[:, 3].max().clamp(max=h)
    cw, ch = round(float(x1 - x0)), round(float(y1 - y0))
    if cw * ch >= 0.98 * w * h:
        return ""
    return (f"The model reads only the centre {cw} x {ch} px of this {w} x {h} picture (its processor crops the "
            "middle); the kept-patch images dim the parts it never sees.")


def input_problem(name: str, kind: str, payload, err: BaseException) -> str:
    """Why the value the page (or an API call) sent for the input `name` cannot be used.

    kind: "image", "video" or anything else (numbers, choices); payload: what was sent (a file
    record with `path` / `orig_name` for files)."""
    if kind in ("image", "video"):
        path = getattr(payload, "path", None) or (payload.get("path") if isinstance(payload, dict) else None) or ""
        orig = getattr(payload, "orig_name", None) or (payload.get("orig_name") if isinstance(payload, dict) else None)
        file = os.path.basename(orig or path) or kind
        return image_problem(file, err) if kind == "image" else video_problem(file, err, path)
    if isinstance(payload, float) and not math.isfinite(payload):
        return f"{name} must be a finite number, got {payload}"
    shown = repr(payload) if len(repr(payload)) <= 40 else repr(payload)[:37] + "..."
    return plain(f"{name}: cannot use the value {shown}")


__all__ = ["clean_prompt", "crop_note", "input_problem", "plain", "short", "unknown_words_warning"]
