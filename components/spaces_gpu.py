"""`spaces.GPU` when the `spaces` package is installed (Hugging Face ZeroGPU Spaces), else nothing.

`gpu(fn)` returns `spaces.GPU(duration=...)(fn)` on a Space and `fn` itself everywhere else, so the
app runs unchanged locally; the functions wrapped are the ones that run the model (encode, generate).
"""
from __future__ import annotations

import importlib.util
from typing import Callable

GPU_SECONDS = 120  # per call: encode or generate on a 7B model fits well inside


def has_spaces() -> bool:
    return importlib.util.find_spec("spaces") is not None


def gpu(fn: Callable, duration: int = GPU_SECONDS) -> Callable:
    if not has_spaces():
        return fn
    import spaces

    return spaces.GPU(duration=duration)(fn)


__all__ = ["gpu", "has_spaces"]
