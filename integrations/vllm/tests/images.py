"""Test images: random coloured blocks, reproducible from (width, height, seed)."""
import numpy as np
from PIL import Image


def image(width: int, height: int, seed: int) -> Image.Image:
    rng = np.random.default_rng(seed)
    cells = rng.integers(0, 256, size=(4, 4, 3), dtype=np.uint8)
    return Image.fromarray(cells).resize((width, height), Image.NEAREST)
