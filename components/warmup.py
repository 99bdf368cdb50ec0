"""The compiled decoding path's warm-up: the start-up model answers on `DecodePath(bucket=64,
static_cache=True, compile=True)` (`mipruner.batch.use_decode_path`) once the shapes of the app's
first views have compiled.

A compiled prefill or decoding step is specialised to its shapes (the packed length's bucket and the
batch size; the step also to its static cache's size), and compiling one takes tens of seconds on a GPU.
So at start-up, before a visitor asks, `WarmUp.run` encodes the first example of the gallery with its
prompt and answers, on the compiled path, the batches the first views ask for:

  1. the default view: the unpruned answer and the default methods' at the default budget, one batch;
  2. a slider move: the default methods alone (the unpruned answer is cached by then);
  3. one unpruned answer;

each at the app's answer length (`--max-new-tokens`): one prefill shape and one step shape each.
The warm-up is the model's, not a session's: its encoding is its own and is dropped afterwards.
Until it is done the adapter stays on the plain path, so requests arriving meanwhile answer there
(they wait only while one batch of the warm-up holds the model: `Engine.model_lock`); then the
decode path is switched under the model lock. Each step is published (`message`, read by the page's
status line and the encode status), and a failure leaves the plain path with one sentence: the app
never stops for it. Other shapes (another budget's bucket, another prompt length, a model loaded
later) compile on their first request; models loaded after start-up answer on the plain path.
"""
from __future__ import annotations

import threading
import time
from typing import Callable

from mipruner.models._decode_path import PLAIN, DecodePath

from .messages import plain

COMPILED = DecodePath(bucket=64, static_cache=True, compile=True)
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

    engine: the start-up model's `mipruner.engine.Engine`; media, prompt: what to encode (the gallery's
    first example); methods, budget, max_new_tokens: the default view's settings."""

    def __init__(self, engine, media, prompt: str, methods, budget, max_new_tokens: int, *,
                 path: DecodePath = COMPILED, on_change: Callable[[str], None] | None = None):
        self.engine, self.media, self.prompt = engine, media, prompt
        self.methods, self.budget, self.max_new_tokens = tuple(methods), budget, int(max_new_tokens)
        self.path, self.on_change = path, on_change
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
                        "answers at other lengths compile on their first request.")
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

    def batches(self, encoded) -> list[tuple[str, list]]:
        """(what, rows) of each answer batch to warm: the default view, a slider move, one unpruned answer.
        In-LLM methods answer through their own layer loop, never on this path: they are left out."""
        import mipruner
        from mipruner.pruners import get_pruner

        a = self.engine.adapter
        sels = [mipruner.select(a, encoded, m, self.budget, strict=False) for m in self.methods
                if get_pruner(m).stage != "llm"]
        rows = [[None, *sels], sels, [None]]
        what = [f"the default view's {len(sels) + 1} answers", f"a slider move's {len(sels)} answers",
                "one unpruned answer"]
        return [(w, [(encoded, s) for s in r]) for w, r in zip(what, rows) if r]

    def run(self) -> bool:
        """Warm up now (in this thread); True when the compiled path is on. Never raises."""
        t0 = time.perf_counter()
        a = None
        try:
            self._set(state="waiting")
            if self.media is None:
                raise ValueError("no example image to warm up on")
            a = self.engine.adapter
            with self.engine.model_lock:
                enc = a.encode(self.media, self.prompt, need_attention=True)
            batches = self.batches(enc)
            self._set(state="warming", total=len(batches), done=0, step=batches[0][0])
            for i, (what, rows) in enumerate(batches):
                if i:
                    self._set(done=i, step=what)
                with self.engine.model_lock:
                    a.generate_batch(rows, max_new_tokens=self.max_new_tokens, path=self.path)
            with self.engine.model_lock:
                a.decode_path = self.path
            self._set(state="ready", done=len(batches), seconds=time.perf_counter() - t0)
            return True
        except Exception as e:  # noqa: BLE001 - a failed warm-up leaves the plain path, the app stays up
            if a is not None:
                with self.engine.model_lock:
                    a.decode_path = PLAIN
            self._set(state="failed", why=plain(str(e).strip().splitlines()[0] if str(e).strip()
                                                else type(e).__name__)[:300].rstrip(". "))
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
