"""mipruner: visual-token pruning for multimodal LLMs, built around MI-Pruner.

Importing the package is cheap: it loads the pruners (torch only). Model adapters, which need
transformers, are imported on first use of `mipruner.load`. Gradio is never imported here.
"""
from .pruners import Selection, get_pruner, list_pruners, prune, register_pruner

__version__ = "0.1.0"


def load(model_id_or_path: str, device=None, dtype=None, **kwargs):
    """Load a supported multimodal model and return its adapter (see `mipruner.models`)."""
    from .models import load as _load

    return _load(model_id_or_path, device=device, dtype=dtype, **kwargs)


__all__ = ["Selection", "get_pruner", "list_pruners", "load", "prune", "register_pruner", "__version__"]
