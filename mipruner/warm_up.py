"""Compile a decoding path for the answers a first view asks for, before a visitor asks (the app's warm-up).

`warm_up` answers, on its own encoding of (media, prompt), the batches of a first view on the target
`DecodePath` (`mipruner.batch.use_decode_path`'s arguments): the unpruned answer with the methods'
answers at `budget` (one batch), the methods alone (a slider move: the answer cache keeps the unpruned
one) and one unpruned answer; in-LLM methods never answer in a batch and are left out. Each compiled
shape compiles (and on CUDA records its graph) here instead of in a visitor's request. Only then is the
adapter switched to the path, so requests answered meanwhile run on its current path.
"""
from __future__ import annotations

import threading
from typing import Callable

from .methods import encode_for, select
from .pruners import get_pruner


def warm_up(adapter, lock: threading.Lock, media, prompt: str, methods, budget, max_new_tokens: int,
            on_batch: Callable[[int, int, str], None] | None = None, **path) -> int:
    """Answer the first view's batches on `DecodePath(**path)`, each under `lock`, then switch `adapter` to
    it. `on_batch(i, n, what)` before each batch. Returns the number of batches; what fails raises with
    the adapter's path unchanged."""
    from .batch import use_decode_path
    from .models._decode_path import DecodePath

    target = DecodePath(**path)
    with lock:
        enc = encode_for(adapter, media, prompt, methods)
    sels = [select(adapter, enc, m, budget, strict=False) for m in methods if get_pruner(m).stage != "llm"]
    batches = [(w, r) for w, r in ((f"the default view's {len(sels) + 1} answers", [None, *sels]),
                                   (f"a slider move's {len(sels)} answers", sels),
                                   ("one unpruned answer", [None])) if r]
    for i, (what, rows) in enumerate(batches):
        if on_batch is not None:
            on_batch(i, len(batches), what)
        with lock:
            adapter.generate_batch([(enc, s) for s in rows], max_new_tokens=max_new_tokens, path=target)
    with lock:
        use_decode_path(adapter, **path)
    return len(batches)


__all__ = ["warm_up"]
