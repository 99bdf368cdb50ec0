"""The app's checks of what a visitor sends, without Gradio: the budget in its unit, a video's length.

`UserError` is the one error whose message the page shows as it is (`components.core.logic` raises it too).
"""
from __future__ import annotations

import math

MAX_VIDEO_FRAMES = 3600  # frames in the uploaded stream (2 min at 30 fps): longer videos are refused


class UserError(ValueError):
    """A problem with what the user gave (file, prompt, settings); the message is for the page."""


def probe_video(path: str) -> int:
    """Frames in the video's first stream (from the container's metadata; 0 when it does not say).

    Refuses files with no video stream and videos longer than MAX_VIDEO_FRAMES before anything is
    decoded."""
    from mipruner.media import MediaError
    from mipruner.media import probe_video as probe

    try:
        n = probe(path).frames
    except MediaError as e:
        raise UserError(str(e)) from None
    if n > MAX_VIDEO_FRAMES:
        raise UserError(f"the video has {n} frames; this app takes at most {MAX_VIDEO_FRAMES} "
                        "(trim it to a short clip)")
    return n


def budget_of(value, unit: str, n_visual: int):
    """The pruners' budget from the UI: tokens (int, in [1, N_V]) or a percentage (share); out of range in
    either unit: a UserError (a sentence naming the budget)."""
    if value is None:
        raise UserError("set a budget")
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise UserError(f"budget must be a number, got {str(value)[:40]!r}") from None
    if not math.isfinite(value):
        raise UserError(f"budget must be a finite number, got {value}")
    if unit == "%":
        share = float(value) / 100.0
        if not 0.0 < share <= 1.0:
            raise UserError(f"budget in % must be in (0, 100], got {value:g}")
        return share
    if unit != "tokens":
        raise UserError(f"unit must be % or tokens, got {str(unit)[:20]!r}")
    k = int(round(float(value)))
    if k < 1:
        raise UserError(f"budget in tokens must be at least 1, got {value:g}")
    if n_visual and k > n_visual:
        raise UserError(f"budget in tokens must be at most {n_visual} (the visual tokens of this encoding), "
                        f"got {value:g}")
    return k


__all__ = ["MAX_VIDEO_FRAMES", "UserError", "budget_of", "probe_video"]
