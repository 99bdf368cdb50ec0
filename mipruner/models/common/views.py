"""How an adapter may read one image (`encode(views=...)`): "all" the views the model reads, or, for the anyres
families that declare it in `Adapter.view_modes`, "base" (the base view only: fewer tokens, a faster vision tower;
the app's "fewer views for speed" on CPU hardware)."""
from __future__ import annotations

VIEWS = ("all", "base")


def check_views(adapter, views: str) -> str:
    """`views` when `adapter` reads an image that way, else ValueError in a sentence."""
    if views not in VIEWS:
        raise ValueError(f"views must be 'all' or 'base', got {views!r}")
    if views not in getattr(adapter, "view_modes", ("all",)):
        name = getattr(adapter, "family", "") or type(adapter).__name__
        raise ValueError(f"{name} reads an image as one fixed set of views: views='base' is for the anyres "
                         "families (LLaVA-OneVision)")
    return views


__all__ = ["VIEWS", "check_views"]
