"""`spaces.GPU` when the `spaces` package is installed (Hugging Face ZeroGPU Spaces), else nothing.

What the ZeroGPU documentation (huggingface.co/docs/hub/spaces-zerogpu) prescribes, and where the app
does it:
  * `import spaces` first: it patches torch, so that CUDA looks available at start-up and what is
    moved to "cuda" then is placed on the GPU lent to each decorated call. app.py calls `prepare()`
    before anything imports torch; imported later, the model would be placed by an unpatched torch
    (which sees no GPU on a ZeroGPU Space: a 7B model left on the CPU);
  * load the model at start-up, on "cuda" (the engine's default device when torch reports one);
  * decorate every function that runs tensors on the GPU, with a duration sized per kind of call
    (`DURATIONS`, `generate_seconds`; below): `AppLogic` wraps encode, generate, view and inspect (a
    slider move selects on the encoding's tensors, and FastV, DART and SparseVLM run decoder layers
    to select);
  * no `torch.compile` there: the app decodes on the plain path (its compiled path, `--compile`, is
    off on a ZeroGPU Space: components/core/warmup.py).
A decorated call runs in a forked worker that receives its arguments and returns its result
pickled (spaces/zero/wrappers.py): `gpu` sends the handler's `UIState` (its session's encodings on
the host: `Session` pickles without its lock and byte cap), moves its tensors onto the worker's GPU,
runs the handler, and sends (state, result) back with every tensor on the host; the caller's state
object then takes the returned fields in place and the session goes under the byte cap again
(`adopt`). Each call moves the session's encodings both ways (a few MB per encoding at 7B shapes).
`gpu(fn)` returns that wrapper on a ZeroGPU Space and `fn` itself everywhere else (locally, and on a
Space with a dedicated GPU, where `spaces.GPU` leaves functions as they are), so the app runs
unchanged there.
"""
from __future__ import annotations

import functools
import importlib.util
import math
import types
from typing import Callable

import numpy as np
from PIL import Image

# `spaces.GPU(duration=...)`: the most seconds a call may hold the GPU. ZeroGPU refuses a call whose duration
# exceeds the visitor's remaining daily quota (2 min unauthenticated, 3.5 min for a free account, per the
# ZeroGPU page of the hub docs), and shorter durations queue first, so each kind of call asks for what it
# needs with a margin, not one large figure. Sized from the CUDA gpu-check report (docs/gpu/, H100, bf16, 7-8 B
# at full size): one encode 0.07-1.2 s (the first, cold, the longest), a selection under 0.1 s (FastV, DART,
# SparseVLM included: their first K decoder layers), an unpruned + pruned pair of 4-token answers in one
# batch 0.1-0.7 s. A ZeroGPU call adds its own start (the worker, the session's encodings pickled both ways).
DURATIONS = {
    "encode": 30,   # the vision tower once (a video: its sampled frames, decoded in the call) and the prompt
    "view": 15,     # every slider move: selections, and at most the first K decoder layers once per K
    "inspect": 15,  # one patch's PMI with every prompt word (MI's selection at the current settings)
}
GENERATE_BASE_S, GENERATE_TOKEN_S, GENERATE_MAX_S = 10, 0.05, 120


def generate_seconds(rows: int, max_new_tokens: int) -> int:
    """The duration of one Generate: the unpruned answer and each method's decode as one batch of `rows`,
    `max_new_tokens` steps; GENERATE_TOKEN_S per token per row (several times the H100's 7B steps),
    plus GENERATE_BASE_S for the call's start and the batch's prefill, at most GENERATE_MAX_S."""
    steps = GENERATE_TOKEN_S * max(1, rows) * max(1, max_new_tokens)
    return int(min(GENERATE_MAX_S, GENERATE_BASE_S + math.ceil(steps)))


def has_spaces() -> bool:
    return importlib.util.find_spec("spaces") is not None


def prepare() -> bool:
    """Import `spaces` now when it is installed (before anything imports torch); True when it is."""
    if not has_spaces():
        return False
    import spaces  # noqa: F401  (patches torch on import)

    return True


def on_zero_gpu() -> bool:
    """True on a ZeroGPU Space (where the sweep area, which runs the model many times, is refused)."""
    if not has_spaces():
        return False
    try:
        from spaces.config import Config
    except ImportError:
        return False
    return bool(getattr(Config, "zero_gpu", False))


def gpu(fn: Callable, duration: int | Callable = 60, adopt: Callable | None = None) -> Callable:
    """`fn(state, ...)` as a ZeroGPU task (see the module's docstring); `fn` itself off ZeroGPU.
    duration: seconds, or a callable of `fn`'s arguments returning seconds (spaces' dynamic duration);
    adopt(state): what the caller's process re-attaches to a state that came back (the byte cap)."""
    if not has_spaces():
        return fn
    import spaces

    task = spaces.GPU(duration=duration)(in_worker(fn))
    if not hasattr(task, "zerogpu"):  # not a ZeroGPU Space: spaces.GPU returned the function as it was
        return fn
    return in_caller(task, adopt)


def in_worker(fn: Callable) -> Callable:
    """The worker's side: the arguments' tensors onto its GPU, then (state, result) onto the host."""
    @functools.wraps(fn)
    def run(*args, **kwargs):
        import torch

        if torch.cuda.is_available():
            args, kwargs = move_tensors((list(args), kwargs), torch.device("cuda"))
        out = fn(*args, **kwargs)
        return move_tensors((args[0] if args else None, out), torch.device("cpu"))
    return run


def in_caller(task: Callable, adopt: Callable | None) -> Callable:
    """The caller's side: `task` returns (state, result); the caller's own state object takes the
    returned state's fields, so what the worker cached stays with the browser session."""
    @functools.wraps(task)
    def call(state, *args, **kwargs):
        progress = kwargs.pop("progress", None)  # Gradio's progress object stays in the caller's process
        if progress is not None:
            progress((0, 1), desc="on the GPU")
        after, out = task(state, *args, **kwargs)
        if state is not None and after is not None and after is not state:
            state.__dict__.update(after.__dict__)
            if isinstance(out, tuple) and out and out[0] is after:
                out = (state, *out[1:])
            after = state
        if isinstance(out, tuple) and out and after is None and hasattr(out[0], "session"):
            after = out[0]  # encode made the state
        if adopt is not None and after is not None:
            adopt(after)
        return out
    return call


_OPAQUE = (str, bytes, int, float, complex, bool, type(None), np.ndarray, Image.Image, type, types.ModuleType,
           types.FunctionType, types.BuiltinFunctionType, types.MethodType, functools.partial, set, frozenset)


def move_tensors(obj, device):
    """`obj` with every tensor reachable through lists, dicts, tuples, dataclasses and plain objects
    moved to `device`: lists, dicts and objects changed in place, tuples rebuilt; models, arrays,
    images and functions are left alone. Returns `obj` (or its rebuilt tuple)."""
    import torch

    seen: dict[int, object] = {}

    def go(x):
        if isinstance(x, torch.Tensor):
            return x.to(device)
        if isinstance(x, _OPAQUE) or isinstance(x, torch.nn.Module):
            return x
        if id(x) in seen:
            return seen[id(x)]
        seen[id(x)] = x
        if isinstance(x, dict):
            for k, v in list(x.items()):
                x[k] = go(v)
        elif isinstance(x, list):
            x[:] = [go(v) for v in x]
        elif isinstance(x, tuple):
            items = [go(v) for v in x]
            if any(a is not b for a, b in zip(items, x)):
                seen[id(x)] = type(x)(*items) if hasattr(x, "_fields") else type(x)(items)
        elif hasattr(x, "__dict__"):
            for k, v in list(vars(x).items()):
                moved = go(v)
                if moved is not v:
                    object.__setattr__(x, k, moved)
        return seen[id(x)]

    return go(obj)


__all__ = ["DURATIONS", "GENERATE_BASE_S", "GENERATE_MAX_S", "GENERATE_TOKEN_S", "generate_seconds", "gpu",
           "has_spaces", "in_caller", "in_worker", "move_tensors", "on_zero_gpu", "prepare"]
