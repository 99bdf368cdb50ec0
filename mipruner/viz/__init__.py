"""Rendering a Selection over the original media: kept-patch masks, PMI / score heatmaps, pivot maps.

Pure functions of (Encoded, Selection) -> PIL images, in numpy + PIL; matplotlib only for colormap
tables and colour bars (`mipruner.viz.colorbar`), imported lazily, never pyplot. Geometry is read from
`Encoded.geometry` alone: token boxes are in each frame's ORIGINAL pixel coordinates.

How it stays fast (a slider drives these): everything that depends only on the encoding is built
once into a `Layout` (the strip of frames as one uint8 array, its dimmed copy, and a label map
giving, per pixel, the visual token whose box covers it). A render is then one gather through the
label map (`lut[label]`) and one blend: no per-token drawing. Pass the same `layout=` to every call
for one encoding (the engine caches it); without it each call builds its own.

Conventions
  * Several frames (video, multi-view, LLaVA-NeXT's base + tile views) are laid side by side in a
    horizontal strip, `gap` pixels apart; `frame=i` crops one frame out of a render.
  * Tokens of kind "newline" (and empty boxes) have no area and are ignored.
  * Where boxes of one frame overlap, a pixel belongs to the smallest box covering it.
  * Frames larger than `max_side` pixels are shown downscaled; click coordinates on the strip go
    back to original coordinates through `Layout.locate`.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image

from .colorbar import colorbar, with_colorbar  # noqa: F401 (the app reaches them through viz)
from .layout import NO_BOX_KINDS, Layout, build_layout


def _layout(encoded, layout: Layout | None) -> Layout:
    return layout if layout is not None else build_layout(encoded)


def _gather(layout: Layout, per_token: np.ndarray, fill) -> np.ndarray:
    """Per-pixel value of the covering token: per_token[label], `fill` where no token: (H, W, ...)."""
    lut = np.concatenate([np.asarray([fill], dtype=per_token.dtype).reshape((1,) + per_token.shape[1:]),
                          per_token])  # index 0 = no token
    return lut[layout.label + 1]


def _numpy(x) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        return x.detach().to(torch.float32).cpu().numpy() if x.is_floating_point() else x.detach().cpu().numpy()
    return np.asarray(x)


def kept_mask(encoded, selection, frame: int | None = None, *, layout: Layout | None = None) -> Image.Image:
    """The original image (or strip of frames) with dropped tokens' boxes dimmed, kept ones clear.

    Pixels no token covers (e.g. outside a centre crop) are dimmed too: the model never saw them.
    The token-grid outline is the layout's (`build_layout(grid_alpha=...)`). An in-LLM selection that
    withdraws every visual token from layer k (`extras["withdrawn_at"]`) is all dimmed and says
    "all withdrawn from layer k" in its top-left corner (and `info["label"]`).
    """
    lay = _layout(encoded, layout)
    clear = np.zeros(len(encoded.geometry) + 1, dtype=np.uint8)  # entry 0: pixels no token covers
    clear[1 + _numpy(selection.keep if hasattr(selection, "keep") else selection).astype(np.int64)] = 255
    img = lay.composite(clear)
    img = img if frame is None else Image.fromarray(lay.crop(np.asarray(img), frame))
    layer = getattr(selection, "extras", {}).get("withdrawn_at")
    if layer is not None:
        from PIL import ImageDraw

        img = img.copy()
        img.info["label"] = f"all withdrawn from layer {layer}"
        draw = ImageDraw.Draw(img)
        text = img.info["label"]
        if draw.textbbox((4, 4), text)[2] > img.width - 4:  # a small picture: on two lines
            text = text.replace(" from", "\nfrom")
        box = draw.multiline_textbbox((4, 4), text)
        draw.rectangle((box[0] - 2, box[1] - 2, box[2] + 2, box[3] + 2), fill=(0, 0, 0))
        draw.multiline_text((4, 4), text, fill=(255, 255, 255))
    return img


@functools.lru_cache(maxsize=16)
def colormap_lut(name: str = "viridis") -> np.ndarray:
    """(256, 3) uint8 colour table of a matplotlib colormap (pure data: safe to memoise)."""
    import matplotlib

    cmap = matplotlib.colormaps[name]
    lut = cmap(np.linspace(0.0, 1.0, 256))[:, :3]  # (256, 3) float in [0, 1]
    lut = np.round(lut * 255).astype(np.uint8)
    lut.setflags(write=False)
    return lut


def value_range(values, has_box: np.ndarray | None = None, vmin: float | None = None,
                vmax: float | None = None) -> tuple[float, float]:
    """(lo, hi) a heatmap's colours span: vmin/vmax, else over finite boxed values (else 0, 1)."""
    v = _numpy(values).astype(np.float64).reshape(-1)
    ok = np.isfinite(v) if has_box is None else (np.isfinite(v) & has_box)
    lo = float(np.min(v[ok])) if vmin is None and ok.any() else (vmin if vmin is not None else 0.0)
    hi = float(np.max(v[ok])) if vmax is None and ok.any() else (vmax if vmax is not None else 1.0)
    return float(lo), float(hi)


def color_index(values, has_box: np.ndarray | None = None, vmin: float | None = None,
                vmax: float | None = None) -> np.ndarray:
    """Per-token colour index in [0, 255], linear in the value between vmin and vmax.

    The range defaults to the finite values of boxed tokens (`value_range`); a constant vector maps
    to 128; non-finite values map to 0. Monotone: a larger value never gets a smaller index.
    """
    v = _numpy(values).astype(np.float64).reshape(-1)
    lo, hi = value_range(v, has_box, vmin, vmax)
    if not hi > lo:
        return np.where(np.isfinite(v), 128, 0).astype(np.uint8)
    t = np.clip((np.nan_to_num(v, nan=lo, neginf=lo, posinf=hi) - lo) / (hi - lo), 0.0, 1.0)
    return np.floor(t * 255 + 0.5).astype(np.uint8)


def _blend(lay: Layout, colors: np.ndarray, alpha: float) -> np.ndarray:
    """Per-token colours (N_V, 3) uint8 painted over their boxes at opacity alpha: (H, W, 3)."""
    a = int(round(min(max(alpha, 0.0), 1.0) * 256))
    col = _gather(lay, colors.astype(np.uint16) * a, (0, 0, 0))  # (H, W, 3) uint16, 0 off tokens
    col += lay.base_term(a)  # <= 255 * 256: no overflow
    col >>= 8
    return col.astype(np.uint8)


def scores_heatmap(encoded, values, frame: int | None = None, *, layout: Layout | None = None,
                   cmap: str = "viridis", alpha: float = 0.6, vmin: float | None = None,
                   vmax: float | None = None) -> Image.Image:
    """Any per-token vector (N_V,) painted over the token boxes with a colormap, alpha-blended.
    Its `info` keeps "vmin", "vmax" (`value_range`) and "cmap": `with_colorbar` draws from them; and
    "colorbar": "below" when the layout's frames are in a grid (the bar goes under it)."""
    lay = _layout(encoded, layout)
    v = _numpy(values).reshape(-1)
    if v.shape[0] != len(encoded.geometry):
        raise ValueError(f"values must have one entry per visual token ({len(encoded.geometry)}), "
                         f"got {v.shape[0]}")
    lo, hi = value_range(v, lay.has_box, vmin, vmax)
    colors = colormap_lut(cmap)[color_index(v, lay.has_box, lo, hi)]  # (N_V, 3)
    img = Image.fromarray(lay.crop(_blend(lay, colors, alpha), frame))
    img.info.update(vmin=lo, vmax=hi, cmap=cmap)
    if len(set(lay.frame_y)) > 1:  # frames in a grid (a video on the page): its colour bar underneath
        img.info["colorbar"] = "below"
    return img


def _check_mi(selection, what: str) -> None:
    if selection.pmi is None or selection.pivot is None:
        raise ValueError(f"{what} needs an MI selection (with PMI); method {selection.method!r} has none")


def pmi_heatmap(encoded, selection, token_index: int, frame: int | None = None, *,
                layout: Layout | None = None, cmap: str = "viridis", alpha: float = 0.6) -> Image.Image:
    """PMI of every visual token with scoring-text token `token_index` (a column of Selection.pmi).

    Like `scores_heatmap`, plus info["label"]: "PMI with '<token>' (nats)" for its colour bar."""
    _check_mi(selection, "pmi_heatmap")
    n_t = selection.pmi.shape[1]
    if not (isinstance(token_index, (int, np.integer)) and 0 <= token_index < n_t):
        raise ValueError(f"token_index must be in [0, {n_t - 1}] (scoring-text tokens), got {token_index!r}")
    img = scores_heatmap(encoded, selection.pmi[:, int(token_index)], frame, layout=layout, cmap=cmap,
                         alpha=alpha)
    word = encoded.scoring_tokens[int(token_index)].replace("\u2581", "").replace("\u0120", "")
    img.info["label"] = f"PMI with {word!r} (nats)"  # natural log: PMI_cross = log p(t|v) - log p(t)
    return img


def pivot_palette(n: int) -> np.ndarray:
    """(n, 3) uint8 distinct colours (tab20, then tab20b, tab20c; cycles past 60)."""
    import matplotlib

    cols = np.concatenate([np.asarray(matplotlib.colormaps[c].colors)[:, :3] for c in ("tab20", "tab20b", "tab20c")])
    cols = np.round(cols * 255).astype(np.uint8)  # (60, 3)
    return cols[np.arange(n) % len(cols)]


def pivot_map(encoded, selection, frame: int | None = None, *, layout: Layout | None = None,
              alpha: float = 0.6) -> tuple[Image.Image, list[tuple[str, str]]]:
    """Each patch coloured by its pivot word (argmax_j PMI_cross(i, j)).

    Returns (image, legend); legend lists (token string, "#rrggbb") for the pivot tokens that
    occur on some boxed patch, most frequent first; colours are handed out in that order.
    """
    _check_mi(selection, "pivot_map")
    lay = _layout(encoded, layout)
    pivot = _numpy(selection.pivot).astype(np.int64)  # (N_V,)
    tokens = encoded.scoring_tokens
    counts = np.bincount(pivot[lay.has_box], minlength=len(tokens))
    present = [int(j) for j in np.argsort(-counts, kind="stable") if counts[j] > 0]
    palette = pivot_palette(len(present))
    token_color = np.zeros((max(len(tokens), int(pivot.max(initial=0)) + 1), 3), dtype=np.uint8)
    token_color[present] = palette
    img = _blend(lay, token_color[pivot], alpha)
    legend = [(tokens[j] if j < len(tokens) else str(j), "#%02x%02x%02x" % tuple(int(c) for c in token_color[j]))
              for j in present]
    return Image.fromarray(lay.crop(img, frame)), legend


def merge_map(encoded, selection, frame: int | None = None, *, layout: Layout | None = None,
              alpha: float = 0.6) -> tuple[Image.Image, list[tuple[str, str]]]:
    """Which dropped patches a merging method put into which kept one (`Selection.merged_into`):
    each kept patch that received some and the patches merged into it share one colour; the other
    patches are left as they are. Returns (image, legend): ("token i <- n", "#rrggbb") per kept
    patch, the most merged first."""
    if getattr(selection, "merged_into", None) is None:
        raise ValueError("merge_map needs a selection with merged_into (a merging method)")
    lay = _layout(encoded, layout)
    into = _numpy(selection.merged_into).astype(np.int64)  # (N_V,)
    n = into.shape[0]
    counts = np.bincount(into[into >= 0], minlength=n)
    targets = [int(j) for j in np.argsort(-counts, kind="stable") if counts[j] > 0]
    palette = pivot_palette(len(targets))
    group = np.full(n, -1, dtype=np.int64)
    group[targets] = np.arange(len(targets))
    group[into >= 0] = group[into[into >= 0]]
    colors = np.zeros((n, 3), dtype=np.uint8)
    colors[group >= 0] = palette[group[group >= 0]]
    weight = np.where(group >= 0, alpha, 0.0)
    base = np.asarray(lay.base, dtype=np.float32)  # (H, W, 3) the strip as the model saw it
    over = _gather(lay, colors.astype(np.float32), (0.0, 0.0, 0.0))
    w = _gather(lay, weight.astype(np.float32), 0.0)[..., None]
    img = (base * (1 - w) + over * w).round().clip(0, 255).astype(np.uint8)
    legend = [(f"token {j} <- {int(counts[j])}", "#%02x%02x%02x" % tuple(int(c) for c in palette[i]))
              for i, j in enumerate(targets)]
    return Image.fromarray(lay.crop(img, frame)), legend


@dataclass(frozen=True)
class TokenCell:
    """One visual token for click-to-inspect: box in original coords (None if it has no area)."""

    index: int
    frame: int
    row: int
    col: int
    kind: str
    box: tuple[float, float, float, float] | None
    kept: bool
    score: float


def token_cells(encoded, selection) -> list[TokenCell]:
    """Per-token (frame, grid position, box, kept, score), in token order."""
    geo = encoded.geometry
    n = len(geo)
    kept = np.zeros(n, dtype=bool)
    kept[_numpy(selection.keep).astype(np.int64)] = True
    scores = _numpy(selection.scores).astype(np.float64)
    boxes = geo.box.detach().to(torch.float64).cpu().numpy()
    fr, rows, cols = (geo.frame.tolist(), geo.row.tolist(), geo.col.tolist())
    out = []
    for i in range(n):
        b = boxes[i]
        boxed = geo.kind[i] not in NO_BOX_KINDS and bool(np.isfinite(b).all()) and b[2] > b[0] and b[3] > b[1]
        out.append(TokenCell(i, int(fr[i]), int(rows[i]), int(cols[i]), geo.kind[i],
                             tuple(float(x) for x in b) if boxed else None, bool(kept[i]), float(scores[i])))
    return out


def token_at(encoded, frame: int | None, x: float, y: float, *, layout: Layout | None = None) -> int | None:
    """The visual token under a pixel, or None.

    frame=int: (x, y) in that frame's ORIGINAL coordinates (boxes are half-open [x0, x1)).
    frame=None: (x, y) in the rendered strip (as returned by these functions with `layout`).
    The smallest box wins where boxes overlap; newline tokens are never returned.
    """
    if frame is None:
        lay = _layout(encoded, layout)
        xi, yi = int(math.floor(x)), int(math.floor(y))
        W, H = lay.size
        if not (0 <= xi < W and 0 <= yi < H):
            return None
        i = int(lay.label[yi, xi])
        return i if i >= 0 else None
    geo = encoded.geometry
    box = geo.box.to(torch.float64)
    no_box = torch.tensor([k in NO_BOX_KINDS for k in geo.kind], dtype=torch.bool)
    inside = ((geo.frame == frame) & ~no_box & (box[:, 0] <= x) & (x < box[:, 2])
              & (box[:, 1] <= y) & (y < box[:, 3]))  # (N_V,)
    hits = torch.nonzero(inside).flatten()
    if hits.numel() == 0:
        return None
    area = (box[hits, 2] - box[hits, 0]) * (box[hits, 3] - box[hits, 1])
    return int(hits[torch.argmin(area)])  # argmin: first (lowest index) among equal areas


def pmi_row(encoded, selection, index: int) -> list[tuple[str, float]]:
    """(scoring-text token, PMI) for visual token `index`, in prompt order."""
    _check_mi(selection, "pmi_row")
    n = selection.pmi.shape[0]
    if not 0 <= index < n:
        raise ValueError(f"index must be in [0, {n - 1}], got {index}")
    return [(t, float(p)) for t, p in zip(encoded.scoring_tokens, selection.pmi[index].tolist())]


__all__ = ["Layout", "TokenCell", "build_layout", "color_index", "colorbar", "colormap_lut", "kept_mask", "pivot_map",
           "pivot_palette", "pmi_heatmap", "pmi_row", "scores_heatmap", "token_at", "token_cells", "value_range",
           "with_colorbar"]
