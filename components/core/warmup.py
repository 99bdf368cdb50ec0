"""The compiled decoding path's warm-up: the start-up model answers on `DecodePath(bucket=64,
static_cache=True, compile=True)` (`mipruner.serve.batch.use_decode_path`) once the shapes of the app's
first views have compiled.

A compiled prefill or decoding step is specialised to its shapes (rows padded to a power of two, the
width to the bucket; the step also to its static cache's size), and compiling one takes tens of seconds
on a GPU. So at start-up, before a visitor asks, `WarmUp.run` has the engine (`ModelService.warm_up`, i.e.
`mipruner.serve.warm_up`) encode the gallery's first example with its prompt and answer, on the compiled
path, the batches the first views ask for (the default view, a slider move, one unpruned answer) and
then one batch per shape of the fixed set: every row count up to the view's and every width bucket up
to the example's unpruned prompt plus one bucket, at the app's answer length (`--max-new-tokens`).
The warm-up is the model's, not a session's: its encoding is its own and is dropped afterwards.
Until it is done the adapter stays on the plain path, so requests arriving meanwhile answer there
(they wait only while one batch of the warm-up holds the model: `ModelService.model_lock`); then the
decode path is switched under the model lock. Each step is published (`message`, read by the page's
status line and the encode status), and a failure leaves the plain path with one sentence: the app
never stops for it. The shapes it compiled become the adapter's declared buckets (`mipruner.serve.warm_up`):
a request of any other shape (a prompt longer than the warmed widths, more rows, another answer length)
runs eagerly, so no request compiles. Models loaded after start-up answer on the plain path.
"""
from __future__ import annotations

import threading
import time
from typing import Callable

from .messages import plain

COMPILED = dict(bucket=64, static_cache=True, compile=True)  # `use_decode_path`'s arguments
MODES = ("auto", "on", "off")


def compile_choice(mode: str, device_type: str, zero_gpu: bool) -> tuple[bool, str]:
    """(whether the app answers on the compiled path, a sentence when a request for it is refused):
    auto = on CUDA outside a ZeroGPU Space; on = wherever torch.compile may run (not on ZeroGPU,
    where each call runs in a forked worker); off = never."""
    if mode not in MODES:
        raise ValueError(f"--compile must be one of {', '.join(MODES)}, got {mode!r}")
    if mode == "off":
        return False, ""
    if zero_gpu:
        return False, ("The compiled path is off on a ZeroGPU Space (each call runs in a fresh worker), "
                       "so answers run on the plain path." if mode == "on" else "")
    return (device_type == "cuda") if mode == "auto" else True, ""


class WarmUp:
    """The warm-up of one engine's model on `path` (module docstring). `state`: "waiting", "warming",
    "ready" or "failed"; `message` says which in a sentence; `on_change(message)` is called at each step.

    engine: the start-up model's `mipruner.serve.service.ModelService`; media, prompt: what to encode (the gallery's
    first example); methods, budget, max_new_tokens: the default view's settings."""

    def __init__(self, engine, media, prompt: str, methods, budget, max_new_tokens: int, *,
                 path: dict | None = None, on_change: Callable[[str], None] | None = None):
        self.engine, self.media, self.prompt = engine, media, prompt
        self.methods, self.budget, self.max_new_tokens = tuple(methods), budget, int(max_new_tokens)
        self.path, self.on_change = dict(COMPILED if path is None else path), on_change
        self.state, self.done, self.total, self.step, self.why, self.seconds = "waiting", 0, 0, "", "", 0.0
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    @property
    def warming(self) -> bool:
        return self.state in ("waiting", "warming")

    @property
    def message(self) -> str:
        with self._lock:
            if self.state == "waiting":
                return "Warming up the compiled path: encoding the first example; answers run on the plain path meanwhile."
            if self.state == "warming":
                return (f"Warming up the compiled path ({self.done + 1} of {self.total} answer shapes: {self.step}); "
                        "answers run on the plain path meanwhile.")
            if self.state == "ready":
                return (f"The compiled path is warm ({self.total} answer shapes compiled in {self.seconds:.0f} s); "
                        "other shapes run uncompiled.")
            return f"The compiled path's warm-up failed ({self.why}), so answers run on the plain path."

    def note(self) -> str:
        """What a status line adds: the message while warming or after a failure, nothing once ready."""
        return "" if self.state == "ready" else self.message

    def _set(self, **fields) -> None:
        with self._lock:
            for k, v in fields.items():
                setattr(self, k, v)
        if self.on_change is not None:
            self.on_change(self.message)

    def run(self) -> bool:
        """Warm up now (in this thread: `ModelService.warm_up`); True when the compiled path is on. Never raises."""
        t0 = time.perf_counter()
        try:
            self._set(state="waiting")
            if self.media is None:
                raise ValueError("no example image to warm up on")
            n = self.engine.warm_up(self.media, self.prompt, self.methods, self.budget, self.max_new_tokens,
                                    on_batch=lambda i, n, what: self._set(state="warming", done=i, total=n, step=what),
                                    **self.path)
            self._set(state="ready", done=n, total=n, seconds=time.perf_counter() - t0)
            return True
        except Exception as e:  # noqa: BLE001 - a failed warm-up leaves the plain path, the app stays up
            why = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            self._set(state="failed", why=plain(why)[:300].rstrip(". "))
            return False

    def start(self) -> threading.Thread:
        """`run` in a daemon thread (the server starts meanwhile)."""
        self._thread = threading.Thread(target=self.run, name="mipruner-warm-up", daemon=True)
        self._thread.start()
        return self._thread

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for a started warm-up; True when it has ended."""
        if self._thread is not None:
            self._thread.join(timeout)
        return not self.warming


__all__ = ["COMPILED", "MODES", "WarmUp", "compile_choice"]
