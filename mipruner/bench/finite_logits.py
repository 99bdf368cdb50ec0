"""Whether the logits behind an answer were finite: a forward hook on the adapter's output head.

`LogitWatch(adapter)` hooks `adapter.output_head()` (the LM head every answer path calls: plain
`generate`, the batched rows, the in-LLM methods' own decoding) for the duration of a `with`
block. Each call ANDs `torch.isfinite(logits).all()` into one boolean on the device: no host
sync per decoded token. `check(what)` reads it once and raises `RuntimeError("non-finite logits
...")` when any logit was NaN or infinite. A greedy answer over NaN logits still has tokens (argmax
picks one), so a row checked by its tokens alone would pass. The hook is removed when the block ends
(nothing of the model is replaced).
"""
from __future__ import annotations

import torch


class LogitWatch:
    def __init__(self, adapter):
        try:
            self.head = adapter.output_head()
        except (AttributeError, NotImplementedError):  # an adapter without a transformers head: nothing to watch
            self.head = None
        self.finite: torch.Tensor | None = None
        self.calls = 0
        self._handle = None

    def _hook(self, module, args, out):
        logits = out if isinstance(out, torch.Tensor) else out[0]
        ok = torch.isfinite(logits).all()
        self.finite = ok if self.finite is None else self.finite & ok
        self.calls += 1

    def __enter__(self) -> "LogitWatch":
        self.finite, self.calls = None, 0
        if self.head is not None:
            self._handle = self.head.register_forward_hook(self._hook)
        return self

    def __exit__(self, *exc) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None

    def all_finite(self) -> bool | None:
        """True / False once the head ran; None when it did not (or there is no head)."""
        return None if self.finite is None else bool(self.finite)

    def check(self, what: str) -> None:
        if self.all_finite() is False:
            raise RuntimeError(f"non-finite logits (NaN or inf) in {what} ({self.calls} output-head calls)")
