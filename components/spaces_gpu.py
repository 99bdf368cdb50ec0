"""`spaces.GPU` when the `spaces` package is installed (Hugging Face ZeroGPU Spaces), else nothing.

What the ZeroGPU documentation (huggingface.co/docs/hub/spaces-zerogpu) prescribes, and where the app
does it:
  * `import spaces` first: it patches torch, so that CUDA looks available at start-up and what is
    moved to "cuda" then is placed on the GPU lent to each decorated call. app.py calls `prepare()`
    before anything imports torch; imported later, the model would be placed by an unpatched torch
    (which sees no GPU on a ZeroGPU Space: a 7B model left on the CPU);
  * load the model at start-up, on "cuda" (the engine's default device when torch reports one);
  * decorate every function that runs tensors on the GPU: `AppLogic` wraps encode and generate
    (GPU_SECONDS), and view and inspect (VIEW_SECONDS: a slider move selects on the encoding's
    tensors, and FastV, DART and SparseVLM run decoder layers to select);
  * no `torch.compile` there: the app decodes on the plain path (`mipruner.batch.use_decode_path`
    is never called by the app).
Open: a decorated call runs in a forked worker that receives its arguments and returns its result
pickled; the handlers' `UIState` does not pickle yet (docs/gpu-review.md).
`gpu(fn)` returns `spaces.GPU(duration=...)(fn)` on a Space and `fn` itself everywhere else, so the app
runs unchanged locally.
"""
from __future__ import annotations

import importlib.util
from typing import Callable

GPU_SECONDS = 120  # per call: encode or generate on a 7B model fits well inside
VIEW_SECONDS = 30  # per slider move: selections, and at most the first K decoder layers once per K


def has_spaces() -> bool:
    return importlib.util.find_spec("spaces") is not None


def prepare() -> bool:
    """Import `spaces` now when it is installed (before anything imports torch); True when it is."""
    if not has_spaces():
        return False
    import spaces  # noqa: F401  (patches torch on import)

    return True


def gpu(fn: Callable, duration: int = GPU_SECONDS) -> Callable:
    if not has_spaces():
        return fn
    import spaces

    return spaces.GPU(duration=duration)(fn)


__all__ = ["GPU_SECONDS", "VIEW_SECONDS", "gpu", "has_spaces", "prepare"]
