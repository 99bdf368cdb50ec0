"""Test media: random coloured blocks, reproducible from (width, height, seed); a video of such frames."""
import numpy as np
from PIL import Image


def image(width: int, height: int, seed: int) -> Image.Image:
    rng = np.random.default_rng(seed)
    cells = rng.integers(0, 256, size=(4, 4, 3), dtype=np.uint8)
    return Image.fromarray(cells).resize((width, height), Image.NEAREST)


FPS = 2.0


def frames(count: int, width: int, height: int, seed: int, run: int = 2) -> list[Image.Image]:
    """`count` frames in runs of `run` (2: Qwen's temporal patch of 2 frames; 1: every frame its own, as
    LLaVA-OneVision reads them), each run its own random blocks."""
    return [image(width, height, seed * 100 + i // run) for i in range(count)]


def video(count: int, width: int, height: int, seed: int, run: int = 2):
    """vLLM's video item: (T, H, W, 3) uint8 frames and their metadata (already sampled, at FPS)."""
    arr = np.stack([np.asarray(f) for f in frames(count, width, height, seed, run)])
    meta = {"fps": FPS, "duration": count / FPS, "total_num_frames": count, "frames_indices": list(range(count)),
            "video_backend": "opencv", "do_sample_frames": False}
    return arr, meta
