"""Seeded synthetic scenes with ground truth: coloured shapes on textured backgrounds, and clips.

Everything here is numpy + PIL and deterministic for a seed: `make_scene(seed, index)` always
draws the same pixels, so a data set is just a seed and a range of indices (nothing is stored).

Objects are colour x shape categories ("red circle"). Category frequencies follow a fixed
Zipf-like prior and scenes repeat colours ("themes"), so POPE's three negative-sampling rules
(`questions.pope_items`) pick genuinely different absent objects:
  random       any absent category
  popular      absent categories that are most frequent in the data set
  adversarial  absent categories that co-occur most often with the scene's present ones
(Li et al., 2023, "Evaluating Object Hallucination in Large Vision-Language Models", Sec. 4.)

The questions about them are in `questions.py`; `patch_coverage` turns an object mask into
per-patch coverage on any token grid (query recall).
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import numpy as np
from PIL import Image, ImageDraw

# Colours far apart in RGB and hue; backgrounds are desaturated so objects stand out.
COLORS: dict[str, tuple[int, int, int]] = {
    "red": (220, 30, 35),
    "green": (30, 170, 60),
    "blue": (35, 70, 225),
    "yellow": (240, 220, 30),
    "purple": (140, 40, 185),
    "orange": (250, 135, 20),
}
SHAPES: tuple[str, ...] = ("circle", "square", "triangle", "star")
PLURALS: dict[str, str] = {s: s + "s" for s in SHAPES}
NUMBERS: tuple[str, ...] = ("zero", "one", "two", "three", "four")
CATEGORIES: tuple[tuple[str, str], ...] = tuple(itertools.product(COLORS, SHAPES))
FAMILIES: tuple[str, ...] = ("presence", "color", "count")
POPE_SPLITS: tuple[str, ...] = ("random", "popular", "adversarial")

MAX_OBJECTS = 4
COLOR_JITTER = 12  # per-channel jitter of an object's colour; colours stay far apart
# Objects sit on a lattice of LATTICE px (at size 112; scaled with the size) with radius LATTICE:
# each still object covers a 2 x 2 block of 8-px cells, one quarter of its outline per cell, and
# every object of one shape covers the same number of cells. That keeps shape and count within
# reach of the small model trained here on 2 CPU cores in minutes (mipruner.shapes.train); the
# price is less variety of position and size. Clips move by whole lattice steps.
LATTICE = 8
PATCH_MIN_COVER = 0.2  # a token-grid cell "shows" an object when the object covers this share of it
THEME_P = 0.5  # chance that a further object repeats a colour already in the scene (co-occurrence)
# A fixed (seed-independent) Zipf-like prior over the 24 categories, so "popular" has a meaning.
_PRIOR_ORDER = np.random.default_rng(12345).permutation(len(CATEGORIES))
CATEGORY_PRIOR = np.empty(len(CATEGORIES))
CATEGORY_PRIOR[_PRIOR_ORDER] = 1.0 / np.arange(1, len(CATEGORIES) + 1) ** 0.6
CATEGORY_PRIOR /= CATEGORY_PRIOR.sum()


def category_name(color: str, shape: str) -> str:
    return f"{color} {shape}"


@dataclass
class SceneObject:
    """One drawn object: category, exact RGB used, centre/radius in pixels, visible mask (H, W) bool."""

    color: str
    shape: str
    rgb: tuple[int, int, int]
    center: tuple[float, float]
    radius: float
    mask: np.ndarray = field(repr=False)

    @property
    def category(self) -> str:
        return category_name(self.color, self.shape)


@dataclass
class Scene:
    """One image (H, W, 3) uint8 with its objects; `frames`/`tracks` generalise to clips.

    For a still image frames == [image] and tracks[k] == [objects[k]]. For a clip, tracks[k] lists
    object k in every frame (same category, moving centre, per-frame mask).
    """

    seed: int
    index: int
    frames: list[np.ndarray] = field(repr=False)
    tracks: list[list[SceneObject]] = field(repr=False)
    background: str = ""

    @property
    def image(self) -> np.ndarray:
        return self.frames[0]

    @property
    def objects(self) -> list[SceneObject]:
        return [t[0] for t in self.tracks]

    @property
    def categories(self) -> set[str]:
        return {o.category for o in self.objects}

    def pil(self) -> list[Image.Image]:
        return [Image.fromarray(f) for f in self.frames]

    def masks_where(self, color: str | None = None, shape: str | None = None) -> list[np.ndarray]:
        """Per frame, the union mask of the objects matching colour and/or shape."""
        h, w = self.frames[0].shape[:2]
        out = []
        for f in range(len(self.frames)):
            m = np.zeros((h, w), dtype=bool)
            for track in self.tracks:
                o = track[f]
                if (color is None or o.color == color) and (shape is None or o.shape == shape):
                    m |= o.mask
            out.append(m)
        return out


# ----------------------------------------------------------------------------------------------
# Drawing


def _background(rng: np.random.Generator, size: int) -> tuple[np.ndarray, str]:
    """A desaturated textured background (size, size, 3) uint8: noise, stripes or a gradient."""
    kind = ("noise", "stripes", "gradient")[int(rng.integers(3))]
    base = rng.uniform(70, 190)
    tint = rng.uniform(-18, 18, size=3)  # a faint colour cast, far from the object colours
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32) / size
    if kind == "noise":
        coarse = rng.normal(0, 1, size=(size // 8 + 1, size // 8 + 1))
        coarse = np.kron(coarse, np.ones((8, 8)))[:size, :size]
        lum = base + 14 * coarse + rng.normal(0, 10, size=(size, size))
    elif kind == "stripes":
        angle = rng.uniform(0, np.pi)
        period = rng.uniform(0.08, 0.25)
        phase = (xx * np.cos(angle) + yy * np.sin(angle)) / period
        lum = base + 25 * np.sign(np.sin(2 * np.pi * phase)) + rng.normal(0, 5, size=(size, size))
    else:
        angle = rng.uniform(0, 2 * np.pi)
        ramp = xx * np.cos(angle) + yy * np.sin(angle)
        ramp = (ramp - ramp.min()) / max(float(np.ptp(ramp)), 1e-6)
        lum = base - 40 + 80 * ramp + rng.normal(0, 5, size=(size, size))
    img = lum[..., None] + tint[None, None, :]
    return np.clip(img, 0, 255).astype(np.uint8), kind


def _polygon(shape: str, cx: float, cy: float, r: float) -> list[tuple[float, float]] | None:
    if shape == "square":
        s = r * 0.85
        return [(cx - s, cy - s), (cx + s, cy - s), (cx + s, cy + s), (cx - s, cy + s)]
    if shape == "triangle":
        return [(cx + r * np.cos(a), cy + r * np.sin(a) + 0.15 * r)
                for a in (-np.pi / 2, np.pi / 6, 5 * np.pi / 6)]
    if shape == "star":
        pts = []
        for k in range(10):
            rad = r * 1.1 if k % 2 == 0 else r * 0.45
            a = -np.pi / 2 + k * np.pi / 5
            pts.append((cx + rad * np.cos(a), cy + rad * np.sin(a)))
        return pts
    return None  # circle


def shape_mask(shape: str, cx: float, cy: float, r: float, size: int) -> np.ndarray:
    """(size, size) bool mask of one shape, drawn without anti-aliasing (pixels are exact)."""
    canvas = Image.new("L", (size, size), 0)
    draw = ImageDraw.Draw(canvas)
    poly = _polygon(shape, cx, cy, r)
    if poly is None:
        draw.ellipse([cx - r, cy - r, cx + r, cy + r], fill=255)
    else:
        draw.polygon(poly, fill=255)
    return np.asarray(canvas) > 0


def _pick_categories(rng: np.random.Generator, n: int) -> list[tuple[str, str]]:
    """n categories: the first from the prior, later ones repeat a present colour with THEME_P."""
    picked: list[tuple[str, str]] = []
    for _ in range(n):
        p = CATEGORY_PRIOR.copy()
        if picked and rng.random() < THEME_P:
            colors = {c for c, _ in picked}
            p *= np.array([c in colors for c, _ in CATEGORIES], dtype=float)
            p /= p.sum()
        picked.append(CATEGORIES[int(rng.choice(len(CATEGORIES), p=p))])
    return picked


def _place(rng: np.random.Generator, n: int, size: int) -> list[tuple[float, float]]:
    """n lattice centres at least 3 lattice steps apart (Chebyshev), so objects never touch."""
    step = LATTICE * size / 112
    points = np.arange(2, round(size / step) - 1) * step  # keep a whole step of margin
    centres: list[tuple[float, float]] = []
    while len(centres) < n:
        c = (float(rng.choice(points)), float(rng.choice(points)))
        if all(max(abs(c[0] - d[0]), abs(c[1] - d[1])) >= 3 * step for d in centres):
            centres.append(c)
    return centres


def _render(background: np.ndarray, objs: list[tuple[str, str, tuple[int, int, int], float, float, float]],
            size: int) -> tuple[np.ndarray, list[SceneObject]]:
    """Draw objects in order (later on top); masks are the visible parts after occlusion."""
    img = background.copy()
    masks = [shape_mask(shape, cx, cy, r, size) for _, shape, _, cx, cy, r in objs]
    for k in range(len(masks) - 1, -1, -1):  # remove what later objects cover
        for later in masks[k + 1:]:
            masks[k] = masks[k] & ~later
    out = []
    for (color, shape, rgb, cx, cy, r), m in zip(objs, masks):
        img[m] = rgb
        out.append(SceneObject(color, shape, rgb, (float(cx), float(cy)), float(r), m))
    return img, out


def _layout(rng: np.random.Generator, size: int, n_objects: int | None,
            categories: list[tuple[str, str]] | None = None):
    if categories is None:
        n = int(rng.integers(1, MAX_OBJECTS + 1)) if n_objects is None else n_objects
        cats = _pick_categories(rng, n)
    else:
        cats = list(categories)
    radii = [LATTICE * size / 112] * len(cats)
    centres = _place(rng, len(cats), size)
    rgbs = [tuple(int(np.clip(v + rng.integers(-COLOR_JITTER, COLOR_JITTER + 1), 0, 255))
                  for v in COLORS[c]) for c, _ in cats]
    return cats, radii, centres, rgbs


def make_scene(seed: int, index: int, size: int = 112, n_objects: int | None = None,
               categories: list[tuple[str, str]] | None = None) -> Scene:
    """Scene `index` of the data set `seed`: 1-4 non-overlapping objects on a textured background.

    categories: (colour, shape) pairs to draw instead of sampling them (used to balance training).
    """
    rng = np.random.default_rng([seed, index, 0])
    background, kind = _background(rng, size)
    cats, radii, centres, rgbs = _layout(rng, size, n_objects, categories)
    img, objs = _render(background, [(c, s, rgb, x, y, r) for (c, s), rgb, (x, y), r
                                      in zip(cats, rgbs, centres, radii)], size)
    return Scene(seed, index, [img], [[o] for o in objs], kind)


def make_clip(seed: int, index: int, size: int = 112, n_frames: int = 8,
              n_objects: int | None = None) -> Scene:
    """Clip `index` of data set `seed`: objects move one lattice step a frame and bounce off the borders.

    Objects may pass over each other; masks are the visible parts, so a mask can shrink while
    an object is covered.
    """
    rng = np.random.default_rng([seed, index, 1])
    background, kind = _background(rng, size)
    cats, radii, centres, rgbs = _layout(rng, size, n_objects)
    step = LATTICE * size / 112  # one lattice step per frame along x, y or a diagonal
    vel = step * np.array([(1, 0), (0, 1), (1, 1), (1, -1)], dtype=float)[rng.integers(4, size=len(cats))]
    vel *= rng.choice([-1.0, 1.0], size=(len(cats), 1))
    pos = np.array(centres, dtype=float)
    frames, tracks = [], [[] for _ in cats]
    for _ in range(n_frames):
        img, objs = _render(background, [(c, s, rgb, x, y, r) for (c, s), rgb, (x, y), r
                                          in zip(cats, rgbs, pos.tolist(), radii)], size)
        frames.append(img)
        for track, o in zip(tracks, objs):
            track.append(o)
        pos = pos + vel
        lo, hi = 2 * step, size - 2 * step
        bounce = (pos < lo) | (pos > hi)
        vel = np.where(bounce, -vel, vel)
        pos = np.clip(pos, lo, hi)
    return Scene(seed, index, frames, tracks, kind)


def patch_coverage(mask: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """(rows * cols,) fraction of each token-grid cell covered by `mask` (H, W), row-major."""
    h, w = mask.shape
    if h % rows == 0 and w % cols == 0:  # exact cells: one reshape
        return mask.reshape(rows, h // rows, cols, w // cols).mean((1, 3)).reshape(-1)
    ys = np.linspace(0, h, rows + 1).round().astype(int)
    xs = np.linspace(0, w, cols + 1).round().astype(int)
    cov = np.empty((rows, cols))
    for i in range(rows):
        for j in range(cols):
            cov[i, j] = mask[ys[i]:ys[i + 1], xs[j]:xs[j + 1]].mean()
    return cov.reshape(-1)


__all__ = ["CATEGORIES", "COLORS", "FAMILIES", "NUMBERS", "PLURALS", "POPE_SPLITS", "SHAPES", "Scene", "SceneObject",
           "make_clip", "make_scene", "patch_coverage", "shape_mask"]
