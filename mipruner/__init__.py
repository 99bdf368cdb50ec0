"""mipruner: visual-token pruning for multimodal LLMs, built around MI-Pruner.

Importing the package is cheap: it loads the method registry (torch only; the in-LLM methods
register too, their transformers code is imported on first use). Model adapters, which need
transformers, are imported on first use of `mipruner.load`. Gradio is never imported here.

    adapter = mipruner.load("llava-hf/llava-1.5-7b-hf")
    enc = adapter.encode("cat.jpg", "Is there a cat?")
    sel = mipruner.select(adapter, enc, "mi", 64, lam=1.0)    # any registered method
    ans = mipruner.answer(adapter, enc, sel)
    ref, ans = mipruner.answer_batch(adapter, enc, [None, sel])  # several selections, one batch
    sel = mipruner.prune("mi", visual=V, text=T, budget=64)   # pre-LLM methods on plain tensors
    sels = mipruner.select_batch(adapter, encs, "mi", 64)     # B encodings' selections as one batched call
    ans = mipruner.answer(adapter, enc, sel, config=mipruner.GenerationConfig(max_new_tokens=16))

Methods from outside the package (plug-ins: installed packages declaring the entry-point group
`mipruner.pruners`, MIPRUNER_PLUGINS, `mipruner.load_plugins("my_module")`): `mipruner.plugins`;
checking one against the contract the built-ins pass: `mipruner.testing.check_pruner(name)`.
"""
import sys

from .pruners import Param, PrunerSpec, Selection, get_pruner, list_pruners, prune, prune_batch, register_pruner
from . import inllm  # noqa: E402,F401  (registers the in-LLM methods)
from .methods import answer, encode_for, needs_attention, select, select_batch, signals_for
from .pruners.signals import Signals
from .serve.batch import answer_batch  # noqa: E402
from .models.common.generation import GenerationConfig  # noqa: E402  (torch only: no transformers)
from .plugins import load_plugins  # noqa: E402  (installed plug-ins load on the registry's first use)

__version__ = "0.2.0"

# Modules of the flat layout before 0.2, and where each went: importing one says so.
MOVED = {**{f"mipruner.{m}": f"mipruner.serve.{m}" for m in (
    "session", "batch", "answer_cache", "answer_time", "failures", "files", "holdings", "prompt_words", "render",
    "export", "turns", "warm_up")},
    "mipruner.engine": "mipruner.serve.service (its Engine is ModelService)",
    "mipruner.viz_layout": "mipruner.viz.layout", "mipruner.viz_video": "mipruner.viz.video",
    "mipruner.colorbar": "mipruner.viz.colorbar", "mipruner.compute": "mipruner.measure.compute",
    "mipruner.text_table": "mipruner.measure.text_table"}


class _MovedFinder:
    """Last on `sys.meta_path`: an import no finder before it resolved, of a name in `MOVED`, raises
    ModuleNotFoundError naming the module's new place (every other name is left to the usual error)."""

    def find_spec(self, name, path=None, target=None):
        if name in MOVED:
            raise ModuleNotFoundError(f"{name} moved in mipruner 0.2: import {MOVED[name]}", name=name)
        return None


if not any(type(f).__name__ == "_MovedFinder" for f in sys.meta_path):  # once, a reload included
    sys.meta_path.append(_MovedFinder())


def load(model_id_or_path: str, device=None, dtype=None, **kwargs):
    """Load a supported multimodal model and return its adapter (see `mipruner.models`)."""
    from .models import load as _load

    return _load(model_id_or_path, device=device, dtype=dtype, **kwargs)


__all__ = ["GenerationConfig", "Param", "PrunerSpec", "Selection", "Signals", "answer", "answer_batch", "encode_for", "get_pruner", "list_pruners",
           "load", "load_plugins", "needs_attention", "prune", "prune_batch", "register_pruner", "select",
           "select_batch",
           "signals_for", "__version__"]
