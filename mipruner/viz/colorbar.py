"""Colour bars for heatmaps, drawn by matplotlib's own colour-bar machinery (`Figure.colorbar` on
a `ScalarMappable`, Agg canvas; never pyplot), so a heatmap's colours read as values.

`mipruner.viz.scores_heatmap` records the range its colours span in the image's `info`
("vmin", "vmax", "cmap"; `pmi_heatmap` also "label"); `with_colorbar(img, label)` appends the
matching bar: on the right of a picture, under a wide strip of frames, and under a grid of frames (a
video on the page; the heatmap's info "colorbar": "below"), whose frames then keep the panel's width. Bars are memoised by
(range, label, size, colormap): a slider move that leaves a method's scores alone costs a paste.
Text is sized from the picture so it stays readable when the page shrinks the picture to a panel.
"""
from __future__ import annotations

import functools
import threading

import numpy as np
from PIL import Image

_LOCK = threading.Lock()  # matplotlib's font cache is shared: one render at a time
WIDE = 1.6  # a picture wider than this many times its height gets its bar underneath


def font_px(width: int, height: int) -> int:
    """Text size (px) of a bar for a `width` x `height` picture: 4.5% of a picture's longer side,
    2.8% of a strip's width (a page shows either at a few hundred px: text stays ~11 px there)."""
    return max(9, round(0.028 * width if width > WIDE * height else 0.045 * max(width, height)))


@functools.lru_cache(maxsize=32)  # <= 32 bars: a strip's bar is ~1 MB (1820 px wide), a picture's ~0.1 MB
def colorbar(vmin: float, vmax: float, label: str, length: int, font: int, cmap: str = "viridis",
             orientation: str = "vertical") -> Image.Image:
    """An RGB image of a colour bar from vmin to vmax with `label`, `length` px along the bar.

    A constant heatmap (vmin == vmax) gets a bar of +-0.5 around the value (its colour is the
    colormap's middle, as `viz.color_index` paints it). The image is shared (memoised): do not
    modify it.
    """
    from matplotlib import colormaps
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import Normalize
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    if not vmax > vmin:
        vmin, vmax = vmin - 0.5, vmax + 0.5
    vertical = orientation == "vertical"
    label_font = max(8, min(font, int(0.95 * length / max(1, 0.6 * len(label)))))  # fit along the bar
    depth = 6.2 * font if vertical else 4.4 * font  # px across the bar: bar, ticks, tick labels, label
    w, h = (depth, length) if vertical else (length, depth)
    dpi = 72  # 1 pt = 1 px
    with _LOCK:
        fig = Figure(figsize=(w / dpi, h / dpi), dpi=dpi, facecolor="white")
        FigureCanvasAgg(fig)
        pad, thick = 0.06 * length, 1.0 * font
        if vertical:  # bar on the left, tick labels and the label to its right
            cax = fig.add_axes([0.25 * font / w, pad / h, thick / w, 1 - 2 * pad / h])
        else:  # bar on top, tick labels and the label under it
            cax = fig.add_axes([pad / w, 1 - 1.25 * font / h, 1 - 2 * pad / w, thick / h])
        mappable = ScalarMappable(Normalize(vmin, vmax), colormaps[cmap])
        bar = fig.colorbar(mappable, cax=cax, orientation=orientation)
        bar.ax.tick_params(labelsize=font, length=0.3 * font, width=max(1, font / 12), pad=0.2 * font)
        bar.ax.yaxis.get_offset_text().set_fontsize(0.8 * font)
        bar.ax.xaxis.get_offset_text().set_fontsize(0.8 * font)
        bar.outline.set_linewidth(max(1, font / 14))
        bar.set_label(label, fontsize=label_font, labelpad=0.3 * font)
        bar.locator = MaxNLocator(nbins=5 if vertical else 6)
        bar.update_ticks()
        fig.canvas.draw()
        rgb = np.asarray(fig.canvas.buffer_rgba())[..., :3].copy()
    return Image.fromarray(rgb)


def with_colorbar(img: Image.Image, label: str, *, vmin: float | None = None, vmax: float | None = None,
                  cmap: str | None = None) -> Image.Image:
    """`img` with its colour bar: on the right (pictures) or underneath (strips wider than WIDE:1, and
    pictures whose info says "colorbar": "below": a grid of frames).

    The range and colormap default to what `viz.scores_heatmap` stored in `img.info`; a heatmap
    without them raises ValueError (there is nothing to read its colours against).
    """
    vmin = img.info.get("vmin") if vmin is None else vmin
    vmax = img.info.get("vmax") if vmax is None else vmax
    cmap = img.info.get("cmap", "viridis") if cmap is None else cmap
    if vmin is None or vmax is None:
        raise ValueError("the heatmap's value range is unknown: pass vmin= and vmax=, or render it with "
                         "mipruner.viz.scores_heatmap / pmi_heatmap")
    W, H = img.size
    below = img.info.get("colorbar") == "below" and not W > WIDE * H
    f = font_px(W, H) if not below else max(9, round(0.045 * W))  # along the bar: the width
    wide = below or W > WIDE * H
    bar = colorbar(float(vmin), float(vmax), label, W if wide else H, f, cmap,
                   "horizontal" if wide else "vertical")
    out = Image.new("RGB", (W, H + bar.height) if wide else (W + bar.width, H), "white")
    out.paste(img.convert("RGB"), (0, 0))
    out.paste(bar, (0, H) if wide else (W, 0))
    out.info.update({k: v for k, v in img.info.items() if k in ("vmin", "vmax", "cmap", "colorbar")}, label=label)
    return out


__all__ = ["WIDE", "colorbar", "font_px", "with_colorbar"]
