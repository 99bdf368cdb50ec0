"""What the LLaVA family's single-image models (LLaVA-NeXT; Video-LLaVA's image path) accept."""
from __future__ import annotations

from ...media import MediaError, Video


def single_image(media, family: str):
    """One PIL image, else a MediaError naming what the family accepts."""
    from PIL import Image

    if isinstance(media, Image.Image):
        return media
    if isinstance(media, list) and len(media) == 1:
        return media[0]
    what = "a video" if isinstance(media, Video) else f"{len(media)} images"
    raise MediaError(f"{family} takes one image, got {what}")
