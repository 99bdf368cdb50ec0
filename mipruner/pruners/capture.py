"""Selections captured once per shape and replayed: the CUDA-graph path of `mipruner.prune`.

At batch 1 on a GPU a selection is launch-bound: MI's greedy at N_V 576, K 64 is a few hundred small
kernels, each a few microseconds of host time. Every built-in pre-LLM method is written as one
capturable computation (no host sync, no data-dependent Python control flow, shapes fixed by (N_V, K,
dtype); tests/pruners/test_capture.py traces each with `torch.compile(fullgraph=True)`) under the
conditions it declares where it is registered (`register_pruner(capture=Capturable(...))`: its token
cap, its own parameter conditions; this module keeps no list of names), so on CUDA `prune` records
it as a CUDA graph once per (method,
K, parameters, input shapes / dtypes / device) and replays it afterwards: one graph launch, plus
copying the inputs into the graph's buffers and the outputs out of them. A key is recorded the
SECOND time it is seen (the first call runs eagerly): recording costs about two eager runs, which
a shape seen once (a Qwen image of its own size, one gpu-check row) would never win back; the app's
slider moves, an eval over one model's fixed N_V and a bench's repeats see their keys again.
Selections over more than a method's `max_tokens` (default `MAX_TOKENS`) run eagerly: there the work,
not the launches, dominates, and a graph would hold several N_V x N_V buffers in its memory pool.
B equal-shape items run as one batched call (`batched.py`), recorded here as one graph per B.

Why `torch.cuda.CUDAGraph` on the eager code rather than `torch.compile(mode="reduce-overhead")`:
recording is one eager run (milliseconds), where compiling a greedy loop unrolled K times takes
seconds to minutes per K, and a slider in the app moves K; the graph replays the very kernels eager
mode runs, so captured and eager selections are the same bits on one device.

What stays outside the graph, once per call, at the edge (`prune`): parameter and budget checks
(host values), the finiteness checks of the inputs (`selection.check_finite`, one host sync each),
the Selection record's assembly. A `cache=` dict is not used on this path: its entries would live in
the graph's memory, which the next replay overwrites; the captured call recomputes them instead.

Switches: capture is on for CUDA inputs unless the environment sets MIPRUNER_CAPTURE=0 or the code
runs inside `capture.disabled()` (the benches' eager columns). Any failure to record falls back to
eager for that key, with one warning. At most `MAX_GRAPHS` graphs are held (least recently used
dropped), each with its own memory pool (at N_V 576 a few MB; at MAX_TOKENS up to ~70 MB).
"""
from __future__ import annotations

import contextvars
import dataclasses
import os
import threading
import warnings
from collections import OrderedDict
from typing import Any, Callable

import torch

from ._table import METHODS
from .selection import Selection, check_finite, flag_set, values_checked

MAX_GRAPHS = 16  # graphs held at once; each holds its inputs, outputs and intermediates
MAX_TOKENS = 2048  # above this N_V a selection runs eagerly (compute-bound; a graph's pool grows as N_V^2)
_TENSOR_INPUTS = ("visual", "text", "attention", "keys", "attention_heads", "features", "cls")

_ENABLED: contextvars.ContextVar[bool] = contextvars.ContextVar("mipruner_capture", default=True)
_GRAPHS: "OrderedDict[tuple, _Graph | None]" = OrderedDict()  # None: recording failed, run eager
_SEEN: "OrderedDict[tuple, None]" = OrderedDict()  # keys seen once (recorded on the second sighting)
_LOCK = threading.Lock()


def disabled():
    """Within: `prune` runs every selection eagerly (no graph recorded or replayed)."""
    return flag_set(_ENABLED, False)


def enabled(device: torch.device) -> bool:
    """Whether a selection on `device` is captured: CUDA, not switched off (module doc)."""
    return device.type == "cuda" and _ENABLED.get() and os.environ.get("MIPRUNER_CAPTURE", "1") != "0"


@dataclasses.dataclass(frozen=True)
class Capturable:
    """A method's declaration, at registration (`register_pruner(capture=...)`), that its selection is one
    capturable computation: no host sync, no data-dependent Python control flow, shapes fixed by (N_V, K,
    dtype). A method without one always runs eagerly.

    max_tokens: above this N_V it runs eagerly (there the work, not the launches, dominates, and a graph's
        memory pool grows as N_V^2).
    when: (n_v, params) -> bool, the method's own further conditions on its parameters (with their defaults
        filled in) and N_V, e.g. MI-adaptive's K read on the host for k_rule "gain"; None: none.
    static: tensor inputs that are host metadata the method reads on the host (pool's `grid`, from which it
        lays out its cells once, memoized): a graph is keyed by their content (`content_key`) and they are
        passed as they are, not copied into the graph's buffers; a batched call shares them (equal content).
    batch: B equal-shape inputs may run as one batched call (`torch.vmap` over the method's function,
        `batched.prune_batch`): the method has no in-place write into a tensor it made itself from a
        per-item value, and no host shortcut that needs a tensor's storage (`selection.batched`).
    """

    max_tokens: int = MAX_TOKENS
    when: Callable[[int, dict], bool] | None = None
    batch: bool = True
    static: tuple[str, ...] = ()  # tensor inputs that are host metadata (pool's grid): keyed by content

    def allows(self, n_v: int, params: dict) -> bool:
        return n_v <= self.max_tokens and (self.when is None or bool(self.when(n_v, params)))


def capturable(spec, n_v: int, params: dict) -> bool:
    """Whether method `spec` (a MethodSpec or a registered name) with `params` on N_V tokens is one capturable
    computation: what it declared at registration (`Capturable`), its parameters' defaults filled in."""
    if isinstance(spec, str):
        spec = METHODS.get(spec)
    rule = spec.capture
    return rule is not None and rule.allows(n_v, {**spec.defaults(), **params})


def clear() -> None:
    """Drop every recorded graph (and its memory)."""
    with _LOCK:
        _GRAPHS.clear()
        _SEEN.clear()


def _clone(x: Any) -> Any:
    return x.clone() if isinstance(x, torch.Tensor) else x


class _Graph:
    """One recorded selection: static input buffers, the graph, its output Selection."""

    def __init__(self, fn: Callable[..., Selection], tensors: dict, static: dict, device: torch.device):
        self.inputs = {k: torch.empty_like(v, device=device).copy_(v) for k, v in tensors.items()}
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side), values_checked():
            fn(**self.inputs, **static)  # warm-up off the capture: lazy library handles and workspaces
        torch.cuda.current_stream(device).wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, capture_error_mode="thread_local"), values_checked():
            self.out = fn(**self.inputs, **static)

    def __call__(self, tensors: dict) -> Selection:
        for k, v in tensors.items():
            self.inputs[k].copy_(v)
        self.graph.replay()
        out = self.out  # in the graph's memory, which the next replay overwrites: copied out
        return dataclasses.replace(out, **{f.name: _clone(getattr(out, f.name)) for f in dataclasses.fields(out)
                                           if isinstance(getattr(out, f.name), torch.Tensor)},
                                   extras={k: _clone(v) for k, v in out.extras.items()})


def content_key(t: torch.Tensor | None) -> tuple:
    """A host key for a small metadata tensor's content (shape, dtype, hash of its bytes); () for None. Meant
    for host tensors (a geometry's grid): a device tensor would be copied to the host, waiting for it."""
    if t is None:
        return ()
    t = t.detach()
    return (tuple(t.shape), str(t.dtype), hash(t.cpu().numpy().tobytes()))


def _key(name: str, k: int, tensors: dict, static: dict) -> tuple:
    shapes = tuple((n, tuple(t.shape), t.dtype, t.device) for n, t in tensors.items())
    static = {n: content_key(v) if isinstance(v, torch.Tensor) else v for n, v in static.items()}
    # A graph recorded under inference_mode holds inference tensors as its static inputs, which may not be
    # written outside it (and the reverse): one graph per mode.
    return (name, k, shapes, tuple(sorted((n, repr(v)) for n, v in static.items())),
            torch.is_inference_mode_enabled())


def run(spec, k: int, inputs: dict, params: dict, *, fn: Callable[..., Selection] | None = None,
        label: str = "") -> Selection:
    """`spec.fn(budget=k, **inputs, **params)` with the input values checked once here; on CUDA (when
    `enabled` and `capturable`) replayed from a graph recorded on the second call of its key.
    fn, label: another function of the same keywords standing for the method (`batched.py`: B items stacked
    on a leading dim, N_V read as `visual.shape[-2]`), its graphs keyed apart by `label`."""
    fn = fn or spec.fn
    if torch.compiler.is_compiling():  # traced by the caller's torch.compile: the caller owns the edge
        return fn(budget=k, **inputs, **params)
    for name in _TENSOR_INPUTS[2:]:  # visual and text were checked by `prune`
        x = inputs.get(name)
        if isinstance(x, torch.Tensor) and x.is_floating_point() and x.numel():
            check_finite(name, x)
    visual = inputs["visual"]
    if not (enabled(visual.device) and capturable(spec, visual.shape[-2], params)):
        with values_checked():
            return fn(budget=k, **inputs, **params)
    tensors = {n: v for n, v in inputs.items() if isinstance(v, torch.Tensor) and n not in spec.capture.static}
    static = {n: v for n, v in inputs.items() if n not in tensors and n != "cache"}
    static.update(params, budget=k)
    if "cache" in inputs:
        static["cache"] = None  # see the module doc
    key = _key(label + spec.name, k, tensors, static)
    with _LOCK:
        graph = _GRAPHS.get(key, False)
        if graph is False and key not in _SEEN:  # first sighting: eager (module doc)
            _SEEN[key] = None
            while len(_SEEN) > 4 * MAX_GRAPHS:
                _SEEN.popitem(last=False)
            graph = None
        elif graph is False:
            _SEEN.pop(key, None)
            try:
                graph = _Graph(fn, tensors, static, visual.device)
            except Exception as e:  # noqa: BLE001  any failure to record: eager for this key, said once
                warnings.warn(f"mipruner: could not capture {spec.name!r} as a CUDA graph ({type(e).__name__}: "
                              f"{e}); running it eagerly", RuntimeWarning, stacklevel=3)
                graph = None
            _GRAPHS[key] = graph
            while len(_GRAPHS) > MAX_GRAPHS:
                _GRAPHS.popitem(last=False)
        else:
            _GRAPHS.move_to_end(key)
        if graph is not None:
            return graph(tensors)
    with values_checked():
        return fn(budget=k, **inputs, **params)


__all__ = ["Capturable", "content_key", "MAX_GRAPHS", "MAX_TOKENS", "capturable", "clear", "disabled", "enabled", "run"]
