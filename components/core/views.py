"""How the app reads an image: every view the model reads, or (anyres families: LLaVA-OneVision) its base view only.

On CPU hardware a 5-view LLaVA-OneVision encode takes tens of seconds; its base view alone is 1 view (g x g tokens
and a newline), so the page's "Fewer views for speed" box is ticked there by default (`fewer_by_default`) and the
status line says so (`views_note`); on a GPU (ZeroGPU included) it is unticked and hidden. An encode with all views and one with the
base view are different encodings (`mipruner.serve.session.EncodingKey.views`).
"""
from __future__ import annotations

FEWER_LABEL = "Fewer views for speed"


def fewer_by_default(hub) -> bool:
    """Whether the page's box starts ticked: the hub's device is a CPU, or, left to the loader, this machine has no
    CUDA device (a ZeroGPU Space loads its model on "cuda"). An encode's own default follows the device its
    model is on (`components.core.logic.AppLogic.encode`)."""
    import torch

    if hub.device is None:
        return not torch.cuda.is_available()
    return torch.device(hub.device).type == "cpu"


def views_for(adapter, kind: str, fewer: bool) -> str:
    """The `views` an encode asks for: "base" when fewer views are asked, the medium is an image and the model's
    family reads an image by its base view (`view_modes`); else "all"."""
    return "base" if fewer and kind == "image" and "base" in getattr(adapter, "view_modes", ()) else "all"


def views_note(views: str) -> str:
    """The status line's sentence for an encode that read the base view only ("" for all views)."""
    if views != "base":
        return ""
    return (f"Read as 1 view ({FEWER_LABEL.lower()}; untick \"{FEWER_LABEL}\" and press Run to read every view "
            "the model reads, slower).")


__all__ = ["FEWER_LABEL", "fewer_by_default", "views_for", "views_note"]
